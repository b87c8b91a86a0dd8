"""The md5 content digest of the bounded case reads (cases.reading), on SQLite.

PostgreSQL computes ``md5(bytea)`` itself; SQLite has no hash function, so every SQLite
connection gets an aggregate ``paperclip_md5(offset, chunk)`` that hashes a text fed to it in
byte chunks, in order. The read feeds it fixed-size chunks of the column from the same statement
that cuts the page window, so the digest covers the content of the row version the page came
from (a same-length edit behind the ORM moves it) while Python only ever holds one chunk, never
the whole value (the reads stay bounded in memory)."""
import hashlib

from django.db.backends.signals import connection_created

FUNCTION = "paperclip_md5"
# Each chunk makes SQLite copy the whole value once (substr of a blob reads it whole), so the
# chunks are large; Python holds one at a time.
CHUNK_BYTES = 512 * 1024


class _Md5Chunks:
    def __init__(self):
        self._md5 = hashlib.md5(usedforsecurity=False)
        self._seen = 0

    def step(self, offset, chunk):
        if offset != self._seen:  # never hash a text out of order: the read fails instead
            raise ValueError(f"{FUNCTION}: chunk at {offset}, expected {self._seen}")
        data = bytes(chunk or b"")
        self._md5.update(data)
        self._seen += len(data)

    def finalize(self):
        return self._md5.hexdigest()


def window_sql(*, table: str, column: str, where_sql: str) -> str:
    """One SQLite statement answering (byte length, md5 hex, window) for the selected row; its
    parameters are the WHERE parameters, then the window's 1-based start and its length."""
    return (f"WITH RECURSIVE s(b) AS MATERIALIZED (SELECT CAST({column} AS BLOB) FROM {table} WHERE {where_sql}), "
            f"c(i) AS (SELECT 0 UNION ALL SELECT i + {CHUNK_BYTES} FROM c, s WHERE i + {CHUNK_BYTES} < length(s.b)) "
            f"SELECT length(s.b), (SELECT {FUNCTION}(o.i, substr(s.b, o.i + 1, {CHUNK_BYTES})) "
            f"FROM (SELECT i FROM c ORDER BY i) AS o), substr(s.b, %s, %s) FROM s")


def _register(sender, connection, **kwargs):
    if connection.vendor == "sqlite":
        connection.connection.create_aggregate(FUNCTION, 2, _Md5Chunks)


def connect():
    connection_created.connect(_register, dispatch_uid="cases.sqlite_digest")
