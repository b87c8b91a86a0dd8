"""Timestamps come back from PostgreSQL through psycopg's compiled loader (paperclip.core.pg_timestamps)
exactly as Django's own loader gives them: the same instants, the same ``timezone.utc``."""
from datetime import timezone

import psycopg
import pytest
from django.db import connection
from django.db.backends.postgresql.psycopg_any import register_tzloader

pytestmark = [pytest.mark.django_db,
              pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's loader (SQLite has none)")]

VALUES = ["2026-12-06 19:42:55.123456+00", "0001-01-01 00:00:00+00", "9999-12-31 23:59:59.999999+00",
          "2024-02-29 12:00:00+05:30", "1970-01-01 00:00:00+00", "2000-06-30 23:59:59.5-08", "1969-12-31 23:59:59.999-03:30",
          "2026-03-29 01:30:00+01", "1900-01-01 00:00:00+00:19:32"]
QUERY = "SELECT v::timestamptz FROM unnest(%s::text[]) AS v"


def _read(cursor, binary=False):
    if binary:  # (psycopg's own cursor: Django's always asks for text)
        cursor.cursor.execute(QUERY, [VALUES], binary=True)
    else:
        cursor.execute(QUERY, [VALUES])
    return [row[0] for row in cursor.fetchall()]


def test_the_compiled_loader_reads_what_djangos_reads():
    with connection.cursor() as cursor:
        loader = connection.connection.adapters.get_loader(psycopg.adapters.types["timestamptz"].oid,
                                                           psycopg.pq.Format.TEXT)
        assert loader.__module__ == "paperclip.core.pg_timestamps"
        ours, ours_binary = _read(cursor), _read(cursor, binary=True)
    with connection.cursor() as cursor:
        register_tzloader(connection.timezone, cursor.cursor)  # Django's loader, on this cursor only
        theirs = _read(cursor)
    assert ours == theirs == ours_binary and len(ours) == len(VALUES)
    assert all(value.tzinfo is timezone.utc for value in ours + ours_binary)


def test_an_out_of_range_timestamp_is_refused_alike():
    for register in (lambda cursor: None, lambda cursor: register_tzloader(connection.timezone, cursor.cursor)):
        with connection.cursor() as cursor:
            register(cursor)
            with pytest.raises(psycopg.DataError):
                cursor.cursor.execute("SELECT 'infinity'::timestamptz")
                cursor.cursor.fetchall()
