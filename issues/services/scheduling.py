"""Periodic host duties: timer heartbeats, stale-run abandonment, workspace retention, orphaned attachment bytes."""
from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from issues import events

from issues.actors import SYSTEM
from issues.choices import NOT_RUNNABLE_AGENT_STATUSES, WakeSource
from issues.models import Agent, Company, WakeupRequest

from .activity import activity_record
from .attachments import attachments_orphan_sweep
from .company_stop import company_stops_reconcile
from .periods import month_period
from .start_rules import AGENT_BUDGET_STOP
from .runs import runs_promote_due_retries, runs_reap_stale
from .wakeups import agent_wakeup, wakeups_fold_sweep


def timer_heartbeats(*, now=None) -> int:
    """Wake agents whose runtime config asks for a heartbeat every N seconds (idle ones are skipped)."""
    now = now or timezone.now()
    woken = 0
    for agent in Agent.objects.exclude(status__in=NOT_RUNNABLE_AGENT_STATUSES):
        interval = (agent.runtime_config or {}).get("heartbeatIntervalSeconds")
        if not isinstance(interval, int) or interval <= 0:
            continue
        last = WakeupRequest.objects.filter(agent=agent, source=WakeSource.TIMER).order_by("-created_at").first()
        if last is not None and last.created_at > now - timedelta(seconds=interval):
            continue
        agent_wakeup(actor=SYSTEM, agent=agent, source=WakeSource.TIMER)
        woken += 1
    return woken


def budgets_roll_month(*, now=None, agent_id=None) -> int:
    """A new month starts an agent's spend at zero (and lifts a budget stop): every agent from the
    sweep, one agent before its usage is added. (A company's spend starts again with its first spend
    of the month, costs.spend_add, or here from the sweep.)"""
    period = month_period(now)
    stale = Agent.objects.exclude(spend_period=period)
    if agent_id is not None:
        stale = stale.filter(pk=agent_id)
    with transaction.atomic(savepoint=False):  # (inside a usage write: its transaction, no savepoint)
        stopped = stale.filter(pause_reason=AGENT_BUDGET_STOP)
        lifted = list(stopped.values_list("pk", "company_id", "spent_monthly_cents"))
        if lifted:
            Agent.objects.filter(pk__in=[pk for pk, _, _ in lifted]).update(pause_reason="")
        for pk, company_id, spent in lifted:  # the budget stop ends: audited, as it began
            activity_record(actor=SYSTEM, company_id=company_id, action="agent.budget_stop_lifted",
                            entity_type="agent", entity_id=pk, details={"period": period, "previousSpentCents": spent})
        return stale.update(spent_monthly_cents=0, spend_period=period)


def companies_roll_month(*, now=None) -> int:
    """A new month starts every company's spend at zero (its budget stop is lifted by the
    reconcile that follows in the sweep: company_stop)."""
    period = month_period(now)
    return Company.objects.exclude(spend_period=period).update(spent_monthly_cents=0, spend_period=period)


def sweep(*, owner: str, now=None) -> dict:
    from issues.workspaces.service import workspace_retention_sweep

    now = now or timezone.now()
    report = {
        "budgetResets": budgets_roll_month(now=now),
        "companyBudgetResets": companies_roll_month(now=now),
        "companyStops": company_stops_reconcile(now=now),
        "staleRuns": len(runs_reap_stale(now=now, owner=owner)),
        "dueRetries": runs_promote_due_retries(now=now),
        "timerWakes": timer_heartbeats(now=now),
        "workspaces": workspace_retention_sweep(now=now),
        "attachmentOrphans": attachments_orphan_sweep(now=now),
        **wakeups_fold_sweep(),
    }
    # Other apps' periodic work rides on the same tick (embedded worker and Celery beat alike).
    for _receiver, result in events.sweep_ticked.send(sender=None, now=now):
        if isinstance(result, dict):
            report.update(result)
    return report
