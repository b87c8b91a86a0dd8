"""The month spend counts for (budgets reset on the 1st, UTC): one definition for the agents'
and the companies' counters, their roll and their stop."""
from __future__ import annotations

from datetime import timezone as dt_timezone

from django.utils import timezone


def month_period(now=None) -> str:
    """``YYYY-MM`` of ``now`` (default: the current time) in UTC."""
    return (now or timezone.now()).astimezone(dt_timezone.utc).strftime("%Y-%m")
