"""The month spend counts for (budgets reset on the 1st, UTC): one definition for the agents'
and the companies' counters, their roll, their stop and the ledger's "this month"."""
from __future__ import annotations

from datetime import datetime, timezone as dt_timezone

from django.utils import timezone


def month_period(now=None) -> str:
    """``YYYY-MM`` of ``now`` (default: the current time) in UTC."""
    return (now or timezone.now()).astimezone(dt_timezone.utc).strftime("%Y-%m")


def month_start(now=None) -> datetime:
    """The first instant of ``now``'s month, UTC."""
    now = (now or timezone.now()).astimezone(dt_timezone.utc)
    return datetime(now.year, now.month, 1, tzinfo=dt_timezone.utc)
