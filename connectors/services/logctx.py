"""Structured engine log lines (§12.1): every line carries the connector instance, provider, link,
external task, issue, event kind, idempotency key and outcome.

The keys ride on the ``logging.LogRecord`` as attributes (``record.connectorInstanceId``, ...) and
together as ``record.connector`` (a dict, for JSON formatters); the message repeats them as
``key=value`` so a plain text log shows them too. Unknown values are ``None`` (``-`` in the text).
Inside :func:`trace` (the engine enters it around each event apply) lines that do not name them
get the event's instance, link, issue and key from the trace.

This module sits below every engine service (it imports none of them)."""
from __future__ import annotations

import functools
import logging
from contextlib import contextmanager
from contextvars import ContextVar

log = logging.getLogger("connectors.engine")

KEYS = ("connectorInstanceId", "providerKey", "linkId", "externalTaskId", "externalKey", "issueId", "eventKind",
        "idempotencyKey", "outcome")
_TRACE: ContextVar[dict | None] = ContextVar("connector_log_trace", default=None)
_HELD: ContextVar[list | None] = ContextVar("connector_log_held", default=None)


@contextmanager
def trace(**fields):
    """Lines logged inside the block default to ``fields`` (KEYS names); yields the block's dict."""
    current = {**(_TRACE.get() or {}), **{k: v for k, v in fields.items() if v is not None}}
    token = _TRACE.set(current)
    try:
        yield current
    finally:
        _TRACE.reset(token)


def trace_add(**fields) -> None:
    """Add what the block learned meanwhile (the link an import created) to the innermost trace."""
    current = _TRACE.get()
    if current is not None:
        current.update({k: v for k, v in fields.items() if v is not None})


class Held:
    """The lines of a :func:`held` block; :meth:`mark` starts the part that stands even if the block
    raises (``kept``, for the caller to :meth:`emit` when it has redone the rest)."""

    def __init__(self):
        self.lines, self.start, self.kept = [], 0, []

    def mark(self):
        self.start = len(self.lines)

    def emit(self, lines):
        for args, kwargs in lines:
            log.log(*args, **kwargs)


@contextmanager
def held():
    """Lines logged inside the block are emitted when it ends normally. When it raises, none is: those
    since the last ``mark()`` are left in ``kept``. Around a transaction whose work may be rolled back
    and redone (the redo logs it again), except for the step that failed, which is not redone: the
    caller emits its lines after the redo, in order."""
    block = Held()
    token = _HELD.set(block.lines)
    try:
        yield block
    except BaseException:
        _HELD.reset(token)
        block.kept = block.lines[block.start:]
        raise
    _HELD.reset(token)
    block.emit(block.lines)


def link_fields(link) -> dict:
    return {"connectorInstanceId": str(link.instance_id), "providerKey": link.provider_key, "linkId": str(link.pk),
            "issueId": str(link.issue_id) if link.issue_id else None, "externalTaskId": link.external_task_id,
            "externalKey": link.external_key or None}


def fields_of(*, instance=None, link=None, event=None, **given) -> dict:
    """The §12.1 keys from the trace, then the objects given, then explicit values (non-None win).
    Other ``given`` names (``category``, ``attempts``...) follow the keys."""
    fields = dict.fromkeys(KEYS)
    fields.update({k: v for k, v in (_TRACE.get() or {}).items() if k in KEYS})
    if instance is not None:
        fields.update(connectorInstanceId=str(instance.pk), providerKey=instance.provider_key)
    if event is not None:  # an InboundEvent row
        fields.update(eventKind=event.kind, idempotencyKey=event.idempotency_key,
                      externalTaskId=event.external_task_id or fields["externalTaskId"])
    if link is not None:
        fields.update(link_fields(link))
    fields.update({k: (str(v) if k in KEYS and k.endswith("Id") else v) for k, v in given.items() if v is not None})
    return fields


def engine_log(level: int, what: str, *, outcome: str, instance=None, link=None, event=None, **given) -> dict:
    """Log one engine line with the §12.1 keys; returns them (tests, callers that want them)."""
    fields = fields_of(instance=instance, link=link, event=event, outcome=outcome, **given)
    text = " ".join(f"{k}={'-' if v is None else v}" for k, v in fields.items())
    args, kwargs = (level, "%s %s", what, text), {"extra": {**{k: fields[k] for k in KEYS}, "connector": fields}}
    lines = _HELD.get()
    if lines is None:
        log.log(*args, **kwargs)
    else:
        lines.append((args, kwargs))
    return fields


def outbound_logged(write):
    """Decorate the outbound engine's ``_write(effect, link, resumed) -> outcome``: one line per
    delivery attempt's outcome (done, cancelled, retry, parked, failed)."""
    @functools.wraps(write)
    def wrapper(effect, link, resumed):
        outcome = write(effect, link, resumed)
        level = logging.WARNING if outcome in ("parked", "failed") else logging.INFO
        engine_log(level, f"connector outbound {effect.kind} {outcome}", outcome=outcome, link=link,
                   eventKind=f"outbound.{effect.kind}", idempotencyKey=f"{effect.kind}:{effect.source_id}"[:300],
                   effectId=effect.pk, attempts=effect.attempts)
        return outcome
    return wrapper
