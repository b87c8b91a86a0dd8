"""PRP event envelopes as the runner builds them: priorities, the envelope itself, batch framing,
and the shapes of the events the runner emits on its own (log lines, diagnostics, backpressure).

Priorities decide what may be dropped under pressure (never P0): P0 is what the host's decisions
hang on — the terminal, the result, runtime requests, credentials, the runner's own diagnostics
and the turn/session lifecycle; P2 is bulk text (item deltas, output chunks, log lines); P1 is
everything else.

Log lines (a harness's stdout/stderr) are ``item.delta`` events of one item per stream
(``itemId`` ``log-stdout`` / ``log-stderr``), payload ``{"kind": "log", "stream": …, "text":
"<line>\\n"}``: the host's session snapshot shows each stream as one growing item.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone

P0, P1, P2 = 0, 1, 2
EVENT_SCHEMAS = {1: "paperclip.prp.event.v1", 2: "paperclip.prp.event.v2"}
COMMAND_SCHEMAS = {1: "paperclip.prp.command.v1", 2: "paperclip.prp.command.v2"}
PROTOCOL_MIN, PROTOCOL_MAX = min(EVENT_SCHEMAS), max(EVENT_SCHEMAS)  # what hello offers
_P0_TYPES = frozenset({"run.terminal", "run.result.proposed", "auth.credentials.updated", "runner.backpressure",
                       "runner.diagnostic"})
_P0_PREFIXES = ("runtime_request.", "turn.", "session.")
_P2_TYPES = frozenset({"item.delta", "output.body.chunk"})

LOG_EVENT = "item.delta"
SPLIT_TEXT_TYPES = frozenset({"item.delta"})  # payload["text"] may be cut into several events
BATCH_PREFIX, BATCH_SUFFIX = b'{"events":[', b"]}"
BATCH_WRAPPER_BYTES = len(BATCH_PREFIX) + len(BATCH_SUFFIX)
SPLIT_MARGIN = 32  # room for a longer sourceSeq/sourceEventId in the later pieces of a split


def priority_of(event_type: str) -> int:
    if event_type in _P0_TYPES or event_type.startswith(_P0_PREFIXES):
        return P0
    return P2 if event_type in _P2_TYPES else P1


def iso_now(now: datetime | None = None) -> str:
    """RFC 3339 in UTC with milliseconds and ``Z`` (the protocol's time form)."""
    now = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def build_envelope(*, run_id: str, source_instance_id: str, seq: int, event_type: str, payload: dict,
                   protocol_version: int, priority: int, emitted_at: str | None = None,
                   turn_id: str | None = None, item_id: str | None = None, **fields) -> dict:
    """One ``paperclip.prp.event.v<protocol_version>`` envelope; ``fields`` are further optional
    members, verbatim (camelCase)."""
    doc = {
        "schema": EVENT_SCHEMAS[protocol_version],
        "sourceEventId": f"{source_instance_id}-{seq}",
        "sourceSeq": seq,
        "sourceInstanceId": source_instance_id,
        "sourceKind": "runner",
        "runId": run_id,
        "eventType": event_type,
        "schemaVersion": protocol_version,
        "priority": priority,
        "emittedAt": emitted_at or iso_now(),
        "payload": payload,
    }
    if turn_id:
        doc["turnId"] = turn_id
    if item_id:
        doc["itemId"] = item_id
    doc.update(fields)
    return doc


def batch_body(envelopes: list[bytes]) -> bytes:
    """The events request body around stored envelope bytes (sent as they are, never re-encoded)."""
    return BATCH_PREFIX + b",".join(envelopes) + BATCH_SUFFIX


def not_storable(doc, path: str = "$") -> str | None:
    """The path of a string the host cannot store (NUL, unpaired surrogate), or None. Such an event
    would be refused with its whole batch forever, so it is refused before it is stored."""
    stack = [(doc, path)]
    while stack:
        value, where = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if _bad_text(key):
                    return where
                stack.append((item, f"{where}.{key}"))
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{i}]") for i, item in enumerate(value))
        elif isinstance(value, str) and _bad_text(value):
            return where
    return None


def _surrogate(ch: str) -> bool:
    return "\ud800" <= ch <= "\udfff"


def _bad_text(text: str) -> bool:
    return "\x00" in text or (not text.isascii() and any(map(_surrogate, text)))


def clean_text(text: str) -> str:
    """Text from a process made storable: NUL and unpaired surrogates become U+FFFD."""
    if not _bad_text(text):
        return text
    return "".join("\ufffd" if ch == "\x00" or _surrogate(ch) else ch for ch in text)


def split_text(text: str, budget: int) -> list[str]:
    """``text`` cut into pieces whose JSON-encoded form (without quotes) is at most ``budget`` bytes
    each; a character is never cut (escapes count their full length)."""
    if budget < 12:  # the longest escape of one character (\\uXXXX) must fit
        raise ValueError(f"no room for text in a frame ({budget} bytes)")
    pieces, start, used = [], 0, 0
    for i, ch in enumerate(text):
        cost = len(json.dumps(ch, ensure_ascii=False).encode("utf-8")) - 2
        if used + cost > budget:
            pieces.append(text[start:i])
            start, used = i, 0
        used += cost
    pieces.append(text[start:])
    return [piece for piece in pieces if piece]


def log_event(stream: str, text: str) -> tuple[str, dict]:
    """(item id, payload) of one log line of ``stream``."""
    return f"log-{stream}", {"kind": "log", "stream": stream, "text": clean_text(text) + "\n"}


def diagnostic_payload(code: str, message: str, **details) -> dict:
    return {"code": code, "message": message, **details}


def backpressure_event(protocol_version: int, dropped: dict, bound: dict) -> tuple[str, dict]:
    """The event reporting what was dropped under pressure. PRP v2 has no ``runner.backpressure``
    event type: there it is a ``runner.diagnostic`` with code ``backpressure``."""
    payload = {"droppedEvents": sum(dropped.values()), "droppedByPriority": dropped, **bound}
    if protocol_version >= 2:
        return "runner.diagnostic", diagnostic_payload(
            "backpressure", f"{payload['droppedEvents']} low-priority events were dropped under pressure.", **payload)
    return "runner.backpressure", payload
