"""What a link's run mode (§4.2.2) and sync mode (§4.2.1) let the connector do to the issue's work.

Run mode (execution coupling):

- ``paperclip_controlled`` (the instance default): Paperclip governance decides when agents run. An
  external state change informs (a note on the issue) and never commands execution: backlog -> active
  leaves the issue in backlog, and the issue a reopen produces (follow-up or reopened issue) is not
  woken. Routing an issue to an agent (import, re-route, ``/paperclip assign``) follows the host's
  assignment rule, so the routed agent is woken as for any assignment.
- ``symphony_compatible``: active external states make the issue actionable and wake its assignee
  (services/symphony.py, §9).
- ``external_observer``: no execution coupling at all. The connector causes no wake of any kind for
  the link: the import routes and assigns the issue for visibility (§8.1: every imported issue has an
  assignee) without the assignment wake; a re-route, ``/paperclip assign`` or a reopen's follow-up
  assigns without it; an imported comment never wakes the assignee, whatever
  ``wakeOnExternalComment`` says. Whether anyone works on the issue is Paperclip's own business.

Sync mode ``observer``: read and display, mutate neither side. The link record keeps the external
state (title, key, state, envelope, a deletion) for display; the issue gets no field or status change,
no note, no conflict; commands are not executed and not answered (a reply would write to one side);
no outbound write; no wake. The import of a task creates its issue once (an observer link needs an
issue to display on), unwoken and without the "unresolved routing" comment (a health entry instead).
"""
from __future__ import annotations

from django.utils import timezone

from connectors.choices import RunMode, SyncMode
from connectors.models import TaskLink
from issues.actors import SYSTEM
from issues.services.activity import activity_record

OBSERVER_TEXT = "observer link: nothing is changed on either side"


def wakes_allowed(*, run_mode: str, sync_mode: str) -> bool:
    """Whether the connector may cause a wake (assignment, comment, Symphony dispatch) for a link
    with these modes."""
    return run_mode != RunMode.EXTERNAL_OBSERVER and sync_mode != SyncMode.OBSERVER


def connector_may_wake(link: TaskLink) -> bool:
    return wakes_allowed(run_mode=link.run_mode, sync_mode=link.sync_mode)


def import_may_wake(instance) -> bool:
    """For an issue created before its link exists: the link takes the instance's default modes."""
    return wakes_allowed(run_mode=instance.default_run_mode, sync_mode=instance.default_sync_mode)


def is_observer(link: TaskLink) -> bool:
    return link.sync_mode == SyncMode.OBSERVER


def observer_deletion(link: TaskLink, *, what: str, actor_text: str, key: str) -> str:
    """§6.4 on an observer link: no conflict and no note; the link record shows the deletion."""
    TaskLink.objects.filter(pk=link.pk).update(
        envelope={**(link.envelope or {}), "externalDeleted": {"what": what, "by": actor_text,
                                                               "at": timezone.now().isoformat()}},
        last_inbound_at=timezone.now())
    activity_record(actor=SYSTEM, company_id=link.company_id, action="connector.observed_deletion",
                    entity_type="connector_link", entity_id=link.pk,
                    details={"instanceId": str(link.instance_id), "externalTaskId": link.external_task_id,
                             "what": what, "actor": actor_text, "idempotencyKey": key})
    return f"external task {what}, recorded on the observer link ({OBSERVER_TEXT})"
