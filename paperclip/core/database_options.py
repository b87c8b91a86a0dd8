"""PostgreSQL connection options read from the environment (imported by settings: reads no setting)."""
from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

OFF = ("off", "false", "no", "none", "0")
DEFAULT_THRESHOLD = 5  # psycopg's own default


def prepared_statements_options(threshold: str) -> dict:
    """``OPTIONS`` for ``DATABASE_PREPARE_THRESHOLD``: a count (psycopg prepares a statement once it
    has run that many times on one connection, which needs server-side binding), or ``off`` for
    Django's default client-side binding with nothing prepared; empty is the default. Anything else
    refuses to start."""
    value = threshold.strip().lower()
    if value in OFF:
        return {}
    try:
        count = int(value) if value else DEFAULT_THRESHOLD
    except ValueError:
        count = -1
    if count < 1:
        raise ImproperlyConfigured(f"DATABASE_PREPARE_THRESHOLD must be a whole number >= 1 or 'off', got {threshold!r}")
    return {"server_side_binding": True, "prepare_threshold": count}
