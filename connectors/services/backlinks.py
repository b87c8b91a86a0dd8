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

from functools import lru_cache
from urllib.parse import unquote, urlsplit

from django.db import connection

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


@lru_cache(maxsize=1)
def _paired_sql() -> str:
    return (f"SELECT l.issue_id FROM {connection.ops.quote_name(TaskLink._meta.db_table)} l "
            f"WHERE l.company_id = %s AND l.provider_key = %s AND l.external_task_id = %s")


def _paired_issue_ids(instance: ConnectorInstance, external_task_id: str) -> set:
    """The issues this company's links of the provider ever paired with the task (every import of a
    provider with backlinks asks: a statement built once)."""
    found = rows.fetch_rows(_paired_sql(), [rows.pk_value(Company, instance.company_id), instance.provider_key,
                                            external_task_id])
    return {value for value, in found}  # (ids as the driver gives them: the ORM filter below reads either)


def backlinked_issue(instance: ConnectorInstance, task: ExternalTask, *, exclude) -> Issue | None:
    """The issue the task's backlink names, when this company paired it with the task before;
    ``exclude``: issue ids (or a subquery) that may not be linked again (an active link on this
    instance). Provider errors propagate: the event is retried, a delay beats a duplicate issue."""
    if not supported(instance):
        return None
    paired = _paired_issue_ids(instance, task.external_id)
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
