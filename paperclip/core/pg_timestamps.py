"""Timestamps read from PostgreSQL by psycopg's compiled loader.

Django's psycopg backend reads every text-format ``timestamptz`` through a Python subclass of
psycopg's pure-Python loader, to stamp the value with the connection's time zone (the binary format
keeps psycopg's own loader). With ``USE_TZ`` on and the connection in UTC (this project's
settings), psycopg's own loader, compiled with psycopg[binary], returns the same value with the same
``datetime.timezone.utc``, for a fraction of the cost: a checkout reads about a dozen timestamps
and a list page hundreds (bench/timestamp_load_bench.py). In any other configuration Django's loader
stays."""
from __future__ import annotations

from datetime import timezone

import psycopg
from psycopg import pq
from psycopg.adapt import Loader

TIMESTAMPTZ = psycopg.adapters.types["timestamptz"].oid
_COMPILED = psycopg.adapters.get_loader(TIMESTAMPTZ, pq.Format.TEXT)  # (the compiled one with psycopg[binary])


class UtcTimestamptzLoader(Loader):
    """Hands each value to psycopg's registered loader (whose compiled type cannot be subclassed) and
    carries the ``timezone`` attribute Django compares with its connection's on every cursor."""
    timezone = timezone.utc
    format = pq.Format.TEXT

    def __init__(self, oid, context=None):
        super().__init__(oid, context)
        self._compiled = _COMPILED(oid, context)  # (reads in the connection's time zone: UTC)
        self.load = self._compiled.load  # the rows' loader calls it directly (no Python frame)

    def load(self, data):  # (what the instance attribute above stands for)
        return self._compiled.load(data)


def use_compiled_timestamptz(sender, connection, **kwargs):
    """``connection_created`` receiver (paperclip.core.apps)."""
    if connection.vendor == "postgresql" and connection.timezone is timezone.utc:
        connection.connection.adapters.register_loader(TIMESTAMPTZ, UtcTimestamptzLoader)
