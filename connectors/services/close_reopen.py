"""The §7.4 policies for an external task that closes or reopens under its linked issue.

Close: ``TaskLink.close_policy`` (blank: the instance's ``close_policy``) decides what a move of the
external task to a terminal state does to a linked issue that is not terminal.

- ``conflict`` (default): a closure conflict and a note naming the external actor; nothing is closed.
- ``auto_close``: the issue is closed (``done``) through the issue service, but only when it is idle:
  ``backlog`` or ``todo``, no live run (queued, running or waiting for a retry), no pending approval
  (pending or revision requested) and no open blocker. Otherwise the closure conflict of the default,
  saying what the close waits for.

Reopen: ``ConnectorInstance.reopen_policy`` decides what a move of the external task out of terminal
does when the linked issue is done or cancelled.

- ``follow_up`` (default, RECOMMENDED by §7.4): a follow-up issue with a stable idempotency key takes
  over the link (apply_tasks._follow_up).
- ``reopen``: the same issue returns to the status an import of the task in its new state gets
  (``todo`` for active, ``blocked`` for blocked, else ``backlog``), as an audited status change
  through the issue service (the host's checks apply); the link keeps its issue.

Neither wakes anyone outside the Symphony profile (services/run_modes.py); both are idempotent under
redelivery: the transition is taken only while the link's last external category says it has not
been applied yet, inside the event's transaction.
"""
from __future__ import annotations

from connectors.choices import ClosePolicy, ReopenPolicy
from connectors.models import ConnectorInstance, TaskLink
from issues.choices import LIVE_RUN_STATUSES, IssueStatus
from issues.models import HeartbeatRun, Issue

IDLE_STATUSES = (IssueStatus.BACKLOG, IssueStatus.TODO)


def close_policy_of(link: TaskLink, instance: ConnectorInstance) -> str:
    return link.close_policy or instance.close_policy or ClosePolicy.CONFLICT


def reopens_in_place(instance: ConnectorInstance) -> bool:
    return instance.reopen_policy == ReopenPolicy.REOPEN


def auto_close_waits(issue: Issue) -> list[str]:
    """What keeps an auto-close from closing ``issue`` now ([] = it is idle and may be closed)."""
    from issues.selectors import issue_awaiting_approval, open_blockers

    waits = []
    if issue.status not in IDLE_STATUSES:
        waits.append(f"the issue is {issue.status}")
    if issue.checkout_run_id or issue.execution_run_id or HeartbeatRun.objects.filter(
            issue=issue, status__in=LIVE_RUN_STATUSES).exists():
        waits.append("a run is live")
    if issue_awaiting_approval(issue):
        waits.append("an approval is pending")
    if open_blockers(issue):
        waits.append("it has open blockers")
    return waits


def link_close_policy_set(*, actor, link: TaskLink, close_policy: str) -> TaskLink:
    """Set (or, with '', clear) a link's own close policy: configuration, like the connector's, so owners
    and admins only; audited when it changes (setting the same value again changes and records nothing)."""
    from django.db import transaction

    from issues.exceptions import InvalidInput
    from issues.services.activity import activity_record

    from .interventions import require_admin

    require_admin(actor, link.company_id)
    if close_policy not in ("", *ClosePolicy.values):
        raise InvalidInput(details={"closePolicy": [f"Must be '' or one of {', '.join(ClosePolicy.values)}."]})
    with transaction.atomic():
        row = TaskLink.objects.select_for_update().get(pk=link.pk)
        if row.close_policy != close_policy:
            before, row.close_policy = row.close_policy, close_policy
            row.save(update_fields=["close_policy", "updated_at"])
            activity_record(actor=actor, company_id=row.company_id, action="connector.link_updated",
                            entity_type="connector_link", entity_id=row.pk,
                            details={"instanceId": str(row.instance_id), "closePolicy": [before, close_policy]})
    return row
