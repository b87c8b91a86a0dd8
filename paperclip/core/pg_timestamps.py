"""Timestamps read from PostgreSQL by psycopg's compiled loader.

Django's psycopg backend reads every ``timestamptz`` through a Python subclass of psycopg's
pure-Python loader, to stamp the value with the connection's time zone. With ``USE_TZ`` on and the
connection in UTC (this project's settings), psycopg's own loader, compiled with psycopg[binary],
returns the same value with the same ``datetime.timezone.utc``, for a fraction of the cost. A
checkout reads about a dozen timestamps and a list page hundreds; Django's loader took about 7 % of a
checkout's CPU. In any other configuration Django's loader stays."""
from __future__ import annotations

from datetime import timezone

import psycopg
from psycopg import pq
from psycopg.adapt import Loader

FORMATS = (pq.Format.TEXT, pq.Format.BINARY)


def _utc_loader(fmt):
    """A loader that hands each value to psycopg's registered one (compiled where psycopg[binary] is
    installed; its type cannot be subclassed) and carries the ``timezone`` attribute Django compares
    with its connection's on every cursor."""
    compiled = psycopg.adapters.get_loader(psycopg.adapters.types["timestamptz"].oid, fmt)
    if compiled is None:
        return None

    class UtcTimestamptzLoader(Loader):
        timezone = timezone.utc
        format = fmt

        def __init__(self, oid, context=None):
            super().__init__(oid, context)
            self._compiled = compiled(oid, context)  # (reads in the connection's time zone: UTC)
            self.load = self._compiled.load  # the rows' loader calls it directly (no Python frame)

        def load(self, data):
            return self._compiled.load(data)

    return UtcTimestamptzLoader


LOADERS = {fmt: _utc_loader(fmt) for fmt in FORMATS}


def use_compiled_timestamptz(sender, connection, **kwargs):
    """``connection_created`` receiver (paperclip.core.apps)."""
    if connection.vendor != "postgresql" or connection.timezone is not timezone.utc:
        return
    oid = psycopg.adapters.types["timestamptz"].oid
    for loader in LOADERS.values():
        if loader is not None:
            connection.connection.adapters.register_loader(oid, loader)
