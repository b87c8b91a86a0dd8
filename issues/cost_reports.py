"""The cost reports of ``/companies/{id}/costs/…`` (upstream §5.6): reads of the ledger
(``CostEvent``), each one aggregate query over the ``from``/``to`` window (default: this UTC month),
most spent first."""
import re

from django.db.models import Count, F, Q, Sum, Value
from django.db.models.functions import Coalesce

from issues.exceptions import InvalidInput
from issues.models import CostEvent

_DATE_ONLY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", re.ASCII)


def _moment(raw: str, name: str, *, end: bool):
    """An ISO 8601 date-time (naive = UTC) or date; a date as ``to`` covers that whole day."""
    from datetime import datetime, time, timedelta, timezone as dt_timezone

    from django.utils.dateparse import parse_date, parse_datetime

    text = str(raw).strip()
    try:
        if _DATE_ONLY.fullmatch(text):
            day = parse_date(text)
            moment = datetime.combine(day, time(), tzinfo=dt_timezone.utc) + timedelta(days=1 if end else 0)
        else:
            moment = parse_datetime(text)
    except (ValueError, OverflowError):
        moment = None
    if moment is None:
        raise InvalidInput(f"invalid '{name}' date",
                           details={name: ["Must be an ISO 8601 date (2026-01-31) or date-time."]})
    return moment if moment.tzinfo else moment.replace(tzinfo=dt_timezone.utc)


def cost_window(params) -> Q:
    """``from``/``to`` of the cost reports (``occurredAt``, both inclusive; a date-only ``to`` is the
    whole day). Neither given: the current UTC month."""
    from issues.services.periods import month_start

    start, end = params.get("from"), params.get("to")
    if not start and not end:
        return Q(occurred_at__gte=month_start())
    window = Q()
    if start:
        window &= Q(occurred_at__gte=_moment(start, "from", end=False))
    if end:
        moment = _moment(end, "to", end=True)  # a date-only ``to`` is the next midnight: exclusive
        window &= Q(occurred_at__lt=moment) if _DATE_ONLY.fullmatch(str(end).strip()) else Q(occurred_at__lte=moment)
    return window


def percent(spend: int, budget: int) -> float:
    return round(spend / budget * 100, 2) if budget else 0


def cost_summary(*, company, params) -> dict:
    spend = _ledger(company, params).aggregate(s=Sum("cost_cents"))["s"] or 0
    return {"companyId": str(company.pk), "spendCents": spend, "budgetCents": company.budget_monthly_cents,
            "utilizationPercent": percent(spend, company.budget_monthly_cents)}


def _token_sums(prefix: str = "", only=None) -> dict:
    """Spend and token totals (0 when none); with ``prefix`` (``subscription``) the tokens only."""
    names = (("cost_cents", "costCents"), ("input_tokens", "inputTokens"),
             ("cached_input_tokens", "cachedInputTokens"), ("output_tokens", "outputTokens"))
    if prefix:
        names = names[1:]
    return {(f"{prefix}{name[0].upper()}{name[1:]}" if prefix else name): Coalesce(Sum(column, filter=only), Value(0))
            for column, name in names}


def costs_by_agent(*, company, params) -> list[dict]:
    """Spend and tokens per agent that has ledger rows in the window, most spent first, one query.
    Run counts: distinct heartbeat runs of metered (api) and subscription rows."""
    rows = (_ledger(company, params).values("agent_id", "agent__name", "agent__status")
            .annotate(**_token_sums(), **_run_split()).order_by("-costCents", "agent__name", "agent_id"))
    return [{"agentId": str(row.pop("agent_id")), "agentName": row.pop("agent__name"),
             "agentStatus": row.pop("agent__status"), **row} for row in rows]


def costs_by_project(*, company, params) -> list[dict]:
    """Spend and tokens per project (the row's project, else its issue's), most spent first. Two queries."""
    from issues.models import Project

    rows = list(_ledger(company, params).annotate(pid=Coalesce("project_id", "issue__project_id"))
                .filter(pid__isnull=False).values("pid").annotate(**_token_sums()).order_by("-costCents", "pid"))
    names = dict(Project.objects.filter(company=company, pk__in=[row["pid"] for row in rows])
                 .values_list("id", "name"))
    return [{"projectId": str(row["pid"]), "projectName": names.get(row["pid"], ""),
             **{k: v for k, v in row.items() if k != "pid"}} for row in rows]


def _ledger(company, params):
    return CostEvent.objects.filter(company=company).filter(cost_window(params))


def _run_split() -> dict:
    """Distinct heartbeat runs of metered (api) and subscription rows, and the subscription rows' tokens."""
    from issues.services.costs import SUBSCRIPTION_BILLING

    subscription = Q(billing_type__in=SUBSCRIPTION_BILLING)
    return {"apiRunCount": Count("run_id", distinct=True, filter=~subscription),
            "subscriptionRunCount": Count("run_id", distinct=True, filter=subscription),
            **_token_sums("subscription", subscription)}


def costs_by_provider(*, company, params) -> list[dict]:
    """Upstream's ``by-provider``: spend per provider, biller, billing type and model."""
    return list(_ledger(company, params).values("provider", "biller", "model", billingType=F("billing_type"))
                .annotate(**_token_sums(), **_run_split())
                .order_by("-costCents", "provider", "biller", "billingType", "model"))


def costs_by_biller(*, company, params) -> list[dict]:
    """Upstream's ``by-biller``: spend per biller, with how many providers and models it billed."""
    return list(_ledger(company, params).values("biller")
                .annotate(**_token_sums(), **_run_split(), providerCount=Count("provider", distinct=True),
                          modelCount=Count("model", distinct=True))
                .order_by("-costCents", "biller"))


def costs_by_agent_model(*, company, params) -> list[dict]:
    """Upstream's ``by-agent-model``: spend per agent, provider, biller, billing type and model,
    ordered by provider, biller, billing type and model (the console sorts within an agent)."""
    rows = (_ledger(company, params)
            .values("agent_id", "agent__name", "provider", "biller", "model", billingType=F("billing_type"))
            .annotate(**_token_sums()).order_by("provider", "biller", "billingType", "model", "agent__name",
                                                "agent_id"))
    return [{"agentId": str(row.pop("agent_id")), "agentName": row.pop("agent__name"), **row} for row in rows]


SPEND_WINDOWS = (("5h", 5), ("24h", 24), ("7d", 168))  # upstream's rolling windows, the longest last


def costs_window_spend(*, company, params=None, now=None) -> list[dict]:
    """Upstream's ``window-spend``: spend per provider over the last 5 hours, 24 hours and 7 days
    (``biller`` is ``mixed`` when a provider was billed by several). One query for all three; the
    windows are fixed (``params`` is taken as every report takes it, and not read)."""
    from datetime import timedelta

    from django.db.models import Min
    from django.utils import timezone

    now = now or timezone.now()
    since = {label: now - timedelta(hours=hours) for label, hours in SPEND_WINDOWS}
    rows, annotations = [], {}
    for label, _hours in SPEND_WINDOWS:
        inside = Q(occurred_at__gte=since[label])
        annotations.update({f"{label}:{name}": value for name, value in _token_sums(only=inside).items()})
        annotations.update({f"{label}:events": Count("id", filter=inside),
                            f"{label}:billers": Count("biller", distinct=True, filter=inside),
                            f"{label}:biller": Min("biller", filter=inside)})
    grouped = list(CostEvent.objects.filter(company=company, occurred_at__gte=since[SPEND_WINDOWS[-1][0]])
                   .values("provider").annotate(**annotations).order_by("provider"))
    for label, hours in SPEND_WINDOWS:
        found = [row for row in grouped if row[f"{label}:events"]]
        found.sort(key=lambda row: (-row[f"{label}:costCents"], row["provider"]))
        rows += [{"provider": row["provider"],
                  "biller": row[f"{label}:biller"] if row[f"{label}:billers"] == 1 else "mixed",
                  "window": label, "windowHours": hours,
                  **{name: row[f"{label}:{name}"] for name in ("costCents", "inputTokens", "cachedInputTokens",
                                                               "outputTokens")}}
                 for row in found]
    return rows
