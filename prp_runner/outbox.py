"""The durable outbox: every event is committed to a local SQLite file before it is sent.

One file per run (it records the run id and refuses another), ``journal_mode=WAL`` and
``synchronous=FULL`` (each commit is fsynced), held by one runner process at a time (an exclusive
``flock`` on the file). An envelope is built once, at :meth:`Outbox.append`, and its canonical
bytes are what is sent on every retry and after every restart, so ``sourceEventId`` /
``sourceSeq`` (``<sourceInstanceId>-<seq>``, seq contiguous from 1) never change. The source id is
generated when the file is created and kept for its life.

Entries are pruned only up to the host's cumulative ACK; an ACK below the current one or past the
last produced seq is rejected (logged, nothing changes). Bound: a P1/P2 event that would take the
pending (unacknowledged) events past ``max_pending_events`` / ``max_pending_bytes`` is not stored
— no seq is allocated, so the host never sees a gap — and counted as dropped; P0 is always stored.

Beside the events it keeps what a restarted runner needs: the harness checkpoint (stored in the
same transaction as the event it came with), the commands applied and their results (with a
digest of the command's canonical bytes, and whether the host has the result), and the facts the
terminal is derived from (the last proposed result, the terminal's seq, the runtime requests asked).
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import sqlite3
import threading
import uuid
from contextlib import contextmanager

from .canonical import canonical_json, digest
from .envelope import BATCH_WRAPPER_BYTES, P0, build_envelope, not_storable

log = logging.getLogger("prp_runner")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    run_id TEXT NOT NULL,
    source_instance_id TEXT NOT NULL,
    produced_seq INTEGER NOT NULL DEFAULT 0,
    acked_seq INTEGER NOT NULL DEFAULT 0,
    dropped_p1 INTEGER NOT NULL DEFAULT 0,
    dropped_p2 INTEGER NOT NULL DEFAULT 0,
    checkpoint TEXT,
    applied_controller_seq INTEGER NOT NULL DEFAULT 0,
    terminal_seq INTEGER,
    result TEXT,
    request_ids TEXT NOT NULL DEFAULT '[]'
);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY,
    source_event_id TEXT NOT NULL UNIQUE,
    event_type TEXT NOT NULL,
    priority INTEGER NOT NULL,
    body BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS command_results (
    command_id TEXT PRIMARY KEY,
    controller_seq INTEGER NOT NULL,
    command_type TEXT NOT NULL,
    command_digest TEXT NOT NULL,
    command BLOB NOT NULL,
    result BLOB NOT NULL,
    reported INTEGER NOT NULL DEFAULT 0
);
"""


class OutboxError(Exception):
    """The outbox cannot be used (another run's file, held by another runner, no WAL)."""


class FrameTooLarge(Exception):
    def __init__(self, size: int, limit: int):
        super().__init__(f"an envelope of {size} bytes exceeds the frame limit of {limit} bytes")
        self.size, self.limit = size, limit


class NotStorable(ValueError):
    """A payload string the host cannot store (NUL or unpaired surrogate); ``path`` names it."""


class Outbox:
    def __init__(self, path, run_id: str, *, max_pending_events: int = 10000, max_pending_bytes: int = 64 << 20):
        self.path, self.run_id = str(path), run_id
        self.max_pending_events, self.max_pending_bytes = max_pending_events, max_pending_bytes
        self.protocol_version: int | None = None  # set after hello: the envelope schema
        self.max_envelope_bytes: int | None = None  # set after hello: the negotiated frame limit
        self._lock, self._depth = threading.RLock(), 0
        self._holder = open(self.path, "ab")  # an empty file is an empty SQLite database
        try:
            fcntl.flock(self._holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._holder.close()
            raise OutboxError(f"{self.path} is in use by another runner")
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        if self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0].lower() != "wal":
            self.close()
            raise OutboxError(f"{self.path}: SQLite WAL mode is not available on this filesystem")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        with self.atomic():
            row = self._db.execute("SELECT run_id FROM state").fetchone()
            if row is None:
                self._db.execute("INSERT INTO state (id, run_id, source_instance_id) VALUES (1, ?, ?)",
                                 (run_id, f"prp-{uuid.uuid4().hex[:16]}"))
        if row is not None and row[0] != run_id:
            self.close()
            raise OutboxError(f"{self.path} belongs to run {row[0]}, not {run_id}")
        self._reload()

    # --- transactions -------------------------------------------------------------------------
    @contextmanager
    def atomic(self):
        """One transaction (nested calls are savepoints): an event, its checkpoint and a command's
        result commit together or not at all."""
        with self._lock:
            name = f"sp{self._depth}"
            self._db.execute("BEGIN IMMEDIATE" if self._depth == 0 else f"SAVEPOINT {name}")
            self._depth += 1
            try:
                yield
            except BaseException:
                self._depth -= 1
                self._db.execute("ROLLBACK" if self._depth == 0 else f"ROLLBACK TO {name}")
                if self._depth:
                    self._db.execute(f"RELEASE {name}")
                self._reload()
                raise
            self._depth -= 1
            self._db.execute("COMMIT" if self._depth == 0 else f"RELEASE {name}")

    def _reload(self):
        cursor = self._db.execute("SELECT * FROM state")
        self._state = dict(zip([c[0] for c in cursor.description], cursor.fetchone()))
        self._count, self._bytes = self._db.execute("SELECT COUNT(*), COALESCE(SUM(LENGTH(body)), 0) FROM events "
                                                    "WHERE seq > ?", (self._state["acked_seq"],)).fetchone()

    def _set(self, **values):
        self._db.execute("UPDATE state SET " + ", ".join(f"{k} = ?" for k in values), tuple(values.values()))
        self._state.update(values)

    # --- state ----------------------------------------------------------------------------------
    def _get(self, name):
        with self._lock:
            return self._state[name]

    source_instance_id = property(lambda self: self._get("source_instance_id"))
    produced_seq = property(lambda self: self._get("produced_seq"))
    acked_seq = property(lambda self: self._get("acked_seq"))
    applied_controller_seq = property(lambda self: self._get("applied_controller_seq"))
    terminal_seq = property(lambda self: self._get("terminal_seq"))
    checkpoint = property(lambda self: _loads(self._get("checkpoint")))
    result = property(lambda self: _loads(self._get("result")))
    request_ids = property(lambda self: json.loads(self._get("request_ids")))

    @property
    def dropped(self) -> dict:
        """Events dropped under pressure since the last report, by priority (``{"1": n, "2": m}``)."""
        with self._lock:
            return {"1": self._state["dropped_p1"], "2": self._state["dropped_p2"]}

    @property
    def pending_count(self) -> int:
        with self._lock:
            return self._count

    def pressure_cleared(self) -> bool:
        """The pending events are back to half the bound (so a report does not flap)."""
        with self._lock:
            return self._count <= self.max_pending_events // 2 and self._bytes <= self.max_pending_bytes // 2

    def pragmas(self) -> dict:
        with self._lock:
            return {name: self._db.execute(f"PRAGMA {name}").fetchone()[0] for name in ("journal_mode", "synchronous")}

    # --- events -----------------------------------------------------------------------------------
    def append(self, event_type: str, payload: dict, *, priority: int, checkpoint: dict | None = None,
               turn_id: str | None = None, item_id: str | None = None, clear_drops: bool = False,
               **fields) -> dict | None:
        """Build, store and return the next envelope (None: dropped under pressure; its checkpoint
        is still stored, the harness did get past it). Raises FrameTooLarge / NotStorable without
        storing anything."""
        where = not_storable(payload, "$.payload")
        if where:
            raise NotStorable(where)
        with self.atomic():
            seq = self._state["produced_seq"] + 1
            envelope = build_envelope(run_id=self.run_id, source_instance_id=self._state["source_instance_id"],
                                      seq=seq, event_type=event_type, payload=payload,
                                      protocol_version=self.protocol_version, priority=priority,
                                      turn_id=turn_id, item_id=item_id, **fields)
            body = canonical_json(envelope)
            if self.max_envelope_bytes is not None and len(body) > self.max_envelope_bytes:
                raise FrameTooLarge(len(body), self.max_envelope_bytes)
            saved = {"checkpoint": json.dumps(checkpoint)} if checkpoint is not None else {}
            if priority != P0 and (self._count + 1 > self.max_pending_events
                                   or self._bytes + len(body) > self.max_pending_bytes):
                column = f"dropped_p{priority}"
                self._set(**{column: self._state[column] + 1}, **saved)
                return None
            self._db.execute("INSERT INTO events (seq, source_event_id, event_type, priority, body) "
                             "VALUES (?, ?, ?, ?, ?)", (seq, envelope["sourceEventId"], event_type, priority, body))
            if clear_drops:
                saved.update(dropped_p1=0, dropped_p2=0)
            self._set(produced_seq=seq, **saved, **self._facts(event_type, payload, seq))
            self._count, self._bytes = self._count + 1, self._bytes + len(body)
        return envelope

    def _facts(self, event_type: str, payload: dict, seq: int) -> dict:
        if event_type == "run.terminal" and self._state["terminal_seq"] is None:
            return {"terminal_seq": seq}
        if event_type == "run.result.proposed":
            return {"result": json.dumps(payload)}
        request = payload.get("request") if event_type == "runtime_request.created" else None
        if isinstance(request, dict) and isinstance(request.get("requestId"), str):
            ids = json.loads(self._state["request_ids"])
            return {"request_ids": json.dumps(ids + [request["requestId"]])} if request["requestId"] not in ids else {}
        return {}

    def pending(self, limit: int, max_bytes: int, *, through: int | None = None) -> list[bytes]:
        """Unacknowledged envelopes, oldest first: at most ``limit``, and as many whole envelopes
        as fit an events request body of ``max_bytes`` (at least one), up to seq ``through``."""
        with self._lock:
            rows = self._db.execute("SELECT body FROM events WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
                                    (self._state["acked_seq"], through if through is not None else 2**62, limit))
            batch, size = [], BATCH_WRAPPER_BYTES
            for (body,) in rows:
                extra = len(body) + (1 if batch else 0)  # the comma between envelopes
                if batch and size + extra > max_bytes:
                    break
                batch.append(bytes(body))
                size += extra
            return batch

    def ack(self, seq) -> bool:
        """The host's cumulative ACK: prune every envelope up to ``seq``. False (and a warning)
        for an ACK that goes backwards or past what was produced."""
        with self._lock:
            acked, produced = self._state["acked_seq"], self._state["produced_seq"]
            if type(seq) is not int or seq < acked or seq > produced:
                why = ("it goes backwards" if type(seq) is int and seq < acked else
                       "it is past the last event produced" if type(seq) is int else "it is not an integer")
                log.warning("ACK %r rejected: %s (acknowledged %d, produced %d)", seq, why, acked, produced)
                return False
            if seq > acked:
                with self.atomic():
                    self._db.execute("DELETE FROM events WHERE seq <= ?", (seq,))
                    self._set(acked_seq=seq)
                self._reload()
            return True

    # --- commands --------------------------------------------------------------------------------
    def command_result(self, command_id: str) -> dict | None:
        with self._lock:
            row = self._db.execute("SELECT controller_seq, command_type, command_digest, result, reported "
                                   "FROM command_results WHERE command_id = ?", (command_id,)).fetchone()
        if row is None:
            return None
        return {"controllerSeq": row[0], "type": row[1], "digest": row[2], "result": json.loads(row[3]),
                "reported": bool(row[4])}

    def record_command(self, command: dict, result: dict) -> None:
        """Store a command as applied with its result (to be reported), and advance the applied
        ``controllerSeq``; inside the caller's transaction when there is one."""
        with self.atomic():
            self._db.execute("INSERT INTO command_results (command_id, controller_seq, command_type, command_digest, "
                             "command, result) VALUES (?, ?, ?, ?, ?, ?)",
                             (command["commandId"], command["controllerSeq"], command["type"], digest(command),
                              canonical_json(command), canonical_json(result)))
            self._set(applied_controller_seq=max(self._state["applied_controller_seq"], command["controllerSeq"]))

    def unreported_results(self) -> list[tuple[str, dict]]:
        with self._lock:
            rows = self._db.execute("SELECT command_id, result FROM command_results WHERE reported = 0 "
                                    "ORDER BY controller_seq").fetchall()
        return [(command_id, json.loads(result)) for command_id, result in rows]

    def mark_reported(self, command_id: str, reported: bool = True) -> None:
        with self.atomic():
            self._db.execute("UPDATE command_results SET reported = ? WHERE command_id = ?",
                             (int(reported), command_id))

    def applied_commands(self) -> list[dict]:
        """The commands applied so far, in controllerSeq order (a restart restores its flags)."""
        with self._lock:
            rows = self._db.execute("SELECT command FROM command_results ORDER BY controller_seq").fetchall()
        return [json.loads(command) for (command,) in rows]

    # --- lifetime ----------------------------------------------------------------------------------
    def close(self):
        with self._lock:
            self._db.close()
            self._holder.close()  # releases the flock

    def delete(self):
        """Close and remove the file (a run delivered in full)."""
        self.close()
        for suffix in ("", "-wal", "-shm"):
            try:
                os.remove(self.path + suffix)
            except FileNotFoundError:
                pass


def _loads(text):
    return json.loads(text) if text is not None else None
