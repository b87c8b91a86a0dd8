"""Events into the outbox, as the runner and its harness produce them.

* Over the negotiated frame limit (``maxBatchBytes`` minus the batch wrapper) an envelope is
  never sent whole: text events (``item.delta``, so log lines too) are split into several events
  stored in one transaction (the checkpoint with the last piece); anything else is refused and a
  P0 ``runner.diagnostic`` ``frame_too_large`` (``eventType``, ``bytes``, ``maxBytes``) takes its
  place. A payload the host could not store (NUL, unpaired surrogate) is refused the same way
  (``not_storable``): one such event would otherwise block every later batch.
* Under pressure the outbox drops P1/P2 events; once the pending events are back to half the
  bound one backpressure report (``runner.backpressure``; on PRP v2, which has no such event type,
  ``runner.diagnostic`` ``backpressure``) says how many, by priority — forced out before the
  terminal, since the host takes nothing after it.
* One terminal: a second is ignored and logged (``duplicate_terminal``; never sent: the host takes
  nothing after a terminal).
"""
from __future__ import annotations

import json
import logging
import threading

from .envelope import SPLIT_MARGIN, SPLIT_TEXT_TYPES, backpressure_event, diagnostic_payload, priority_of, split_text
from .outbox import FrameTooLarge, NotStorable

log = logging.getLogger("prp_runner")


class EventSink:
    def __init__(self, outbox, appended: threading.Event):
        self.outbox, self.appended = outbox, appended  # appended: wakes the sender
        self.end_lock = threading.RLock()  # the terminal is produced once, by the harness or derived
        self._dropping = False
        self._closed = False

    def close(self):
        """Store nothing more (the runner is stopping without an end)."""
        with self.end_lock:
            self._closed = True

    def emit(self, event_type: str, payload: dict, *, checkpoint: dict | None = None, turn_id: str | None = None,
             item_id: str | None = None, clear_drops: bool = False) -> bool:
        """Store one event; False when (a piece of) it was dropped or it was refused."""
        if self._closed:
            return False
        fields = {"checkpoint": checkpoint, "turn_id": turn_id, "item_id": item_id,
                  "priority": priority_of(event_type)}
        try:
            stored = self.outbox.append(event_type, payload, clear_drops=clear_drops, **fields)
        except FrameTooLarge as exc:
            if event_type not in SPLIT_TEXT_TYPES or not isinstance(payload.get("text"), str):
                self.diagnostic("frame_too_large", f"A {event_type} event of {exc.size} bytes exceeds the frame "
                                f"limit and was not sent.", eventType=event_type, bytes=exc.size, maxBytes=exc.limit)
                return False
            return self._emit_split(event_type, payload, exc, fields)
        except NotStorable as exc:
            self.diagnostic("not_storable", f"A {event_type} event was not sent: {exc} holds NUL or an unpaired "
                            "surrogate.", eventType=event_type, path=str(exc))
            return False
        self.appended.set()
        if stored is None and not self._dropping:
            self._dropping = True
            log.warning("pending events over the bound (%d): dropping P1/P2 events", self.outbox.pending_count)
        return stored is not None

    def _emit_split(self, event_type: str, payload: dict, exc: FrameTooLarge, fields: dict) -> bool:
        text = payload["text"]
        overhead = exc.size - len(json.dumps(text, ensure_ascii=False).encode("utf-8"))
        try:
            pieces = split_text(text, exc.limit - overhead - SPLIT_MARGIN)
        except ValueError:
            self.diagnostic("frame_too_large", f"A {event_type} event cannot be split to fit the frame limit.",
                            eventType=event_type, bytes=exc.size, maxBytes=exc.limit)
            return False
        checkpoint, stored = fields.pop("checkpoint"), True
        with self.outbox.atomic():  # all pieces or none
            for i, piece in enumerate(pieces):
                last = i == len(pieces) - 1
                stored &= self.outbox.append(event_type, {**payload, "text": piece},
                                             checkpoint=checkpoint if last else None, **fields) is not None
        log.info("a %s event of %d bytes was split into %d events", event_type, exc.size, len(pieces))
        self.appended.set()
        return stored

    def terminal(self, terminal: dict, *, checkpoint: dict | None = None, turn_id: str | None = None) -> bool:
        with self.end_lock:
            if self.outbox.terminal_seq is not None:
                # Logged, not sent: the host takes no event after a run's terminal.
                log.warning("duplicate_terminal: a second terminal was ignored (the run has one already): %s",
                            terminal.get("runTerminalState") if isinstance(terminal, dict) else terminal)
                return False
            self.report_drops(force=True)  # a harness's own terminal too: the host takes nothing after it
            return self.emit("run.terminal", terminal, checkpoint=checkpoint, turn_id=turn_id)

    def diagnostic(self, code: str, message: str, **details):
        log.warning("diagnostic %s: %s", code, message)
        self.emit("runner.diagnostic", diagnostic_payload(code, message, **details))

    def report_drops(self, *, force: bool = False):
        """The backpressure report of the events dropped since the last, once the pressure cleared
        (or ``force``)."""
        with self.outbox.atomic():
            dropped = self.outbox.dropped
            if not sum(dropped.values()) or not (force or self.outbox.pressure_cleared()):
                return
            bound = {"maxPendingEvents": self.outbox.max_pending_events,
                     "maxPendingBytes": self.outbox.max_pending_bytes}
            event_type, payload = backpressure_event(self.outbox.protocol_version, dropped, bound)
            self.emit(event_type, payload, clear_drops=True)
        self._dropping = False
        log.warning("backpressure: %d events were dropped under pressure (by priority %s)", sum(dropped.values()),
                    dropped)
