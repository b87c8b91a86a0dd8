"""§6.3 step 2: the Paperclip backlink an external task already carries, read from the provider.

The backlinks are the ones :meth:`TaskSourceAdapter.set_backlink` writes (a GitHub comment carrying
``<!-- paperclip:backlink -->``, a Linear attachment with ``metadata.paperclip = "backlink"``, a Jira
remote link with ``globalId`` ``paperclip:backlink``); the adapter's optional ``find_backlinks``
returns their URLs. A backlink names an issue by our own URL (``outbound.issue_url``:
``PUBLIC_BASE_URL/issues/<identifier>``), so another deployment's backlink never matches, and only an
issue of the instance's company is ever found.

Anyone who can write to the tracker can forge such a marker (anyone may comment on a public GitHub
repository), and a link made from it would mirror that issue's progress to a task they control. So
a backlink only counts for an issue this company has paired with the same task before (a link of any
instance of this provider, in any status: link records are kept after an unlink, §6.1) — the cases
it exists for: a re-import after an unlink, a second instance of the same tracker, an exported
issue. A task never linked here is not read at all, so a first import costs no provider call."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import unquote, urlsplit

from django.db import connection

from connectors.choices import LinkStatus
from connectors.models import ConnectorInstance, TaskLink
from connectors.providers.base import ExternalTask, ExternalTaskRef
from issues.models import Company, Issue
from paperclip.core import rows

from .common import adapter_class, adapter_for, conf


def issue_identifier_of(url: str) -> str | None:
    """The issue identifier in one of our issue URLs, else None (another host, another path)."""
    base, target = urlsplit(str(conf("PUBLIC_BASE_URL")).rstrip("/")), urlsplit((url or "").strip())
    if (target.scheme.lower(), target.netloc.lower()) != (base.scheme.lower(), base.netloc.lower()):
        return None
    prefix = base.path.rstrip("/") + "/issues/"
    if not target.path.startswith(prefix):
        return None
    identifier = unquote(target.path[len(prefix):]).strip("/")
    return identifier if identifier and "/" not in identifier else None


def supported(instance: ConnectorInstance) -> bool:
    """Whether the instance's provider declares ``find_backlinks`` (read from the class: no secret lookup)."""
    return "find_backlinks" in adapter_class(instance.provider_key).capabilities.operations


@dataclass(frozen=True)
class TaskPairings:
    """What this company's links of the provider say about one task, in any status (link records
    are kept after an unlink, §6.1)."""
    issue_ids: frozenset  # the issues they paired with it (ids as the driver gives them: ORM filters read either)
    unlinked_here: bool  # an operator unlinked it on this instance (§6.4): events must not re-import it


@lru_cache(maxsize=1)
def _pairings_sql() -> str:
    return (f"SELECT l.issue_id, l.instance_id = %s AND l.status = %s "
            f"FROM {connection.ops.quote_name(TaskLink._meta.db_table)} l "
            f"WHERE l.company_id = %s AND l.external_task_id = %s AND l.provider_key = %s")


def task_pairings(instance: ConnectorInstance, external_task_id: str) -> TaskPairings:
    """One statement (built once; ``link_task_pairings_idx``) for the two questions an import asks
    of a task's past links: was it unlinked here, and which issues may its backlink name."""
    found = rows.fetch_rows(_pairings_sql(), [rows.pk_value(ConnectorInstance, instance.pk), LinkStatus.UNLINKED,
                                              rows.pk_value(Company, instance.company_id), external_task_id,
                                              instance.provider_key])
    return TaskPairings(issue_ids=frozenset(issue_id for issue_id, _ in found),
                        unlinked_here=any(bool(here) for _, here in found))


def backlinked_issue(instance: ConnectorInstance, task: ExternalTask, *, exclude,
                     pairings: TaskPairings | None = None) -> Issue | None:
    """The issue the task's backlink names, when this company paired it with the task before;
    ``exclude``: issue ids (or a subquery) that may not be linked again (an active link on this
    instance); ``pairings``: the task's, when the caller read them already. Provider errors
    propagate: the event is retried, a delay beats a duplicate issue."""
    if not supported(instance):
        return None
    paired = (pairings or task_pairings(instance, task.external_id)).issue_ids
    if not paired:
        return None
    urls = adapter_for(instance).find_backlinks(ExternalTaskRef(external_id=task.external_id,
                                                                external_key=task.external_key))
    identifiers = [identifier for identifier in map(issue_identifier_of, urls) if identifier]
    if not identifiers:
        return None
    issues = {issue.identifier: issue for issue in Issue.objects.filter(
        company_id=instance.company_id, identifier__in=identifiers, pk__in=paired).exclude(pk__in=exclude)}
    return next((issues[identifier] for identifier in identifiers if identifier in issues), None)
