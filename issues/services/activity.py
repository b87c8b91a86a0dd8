from contextlib import contextmanager
from contextvars import ContextVar

from django.utils import timezone

from issues.actors import Actor
from issues.models import ActivityLog
from paperclip.core import rows

# What caused the writes in progress (e.g. the connector event being applied): merged into the details
# of every activity row recorded meanwhile, so a row says why it happened without its service knowing.
_CAUSE: ContextVar[dict | None] = ContextVar("activity_cause", default=None)


@contextmanager
def activity_context(**details):
    """While the block runs (in this thread or task), every :func:`activity_record` row carries
    ``details`` too; a row's own details win on a clash. Nested blocks add to the enclosing one.
    Yields the block's details, which :func:`activity_context_add` extends."""
    current = {**(_CAUSE.get() or {}), **details}
    token = _CAUSE.set(current)
    try:
        yield current
    finally:
        _CAUSE.reset(token)


def activity_context_add(**details) -> None:
    """Add what the block learned meanwhile (a link it created) to the innermost active block; the
    rows recorded from now on carry it. A no-op outside any block."""
    current = _CAUSE.get()
    if current is not None:
        current.update(details)


def activity_context_current() -> dict:
    """A copy of the active block's details (``{}`` outside any block)."""
    return dict(_CAUSE.get() or {})


# Rows recorded inside an activity_batched() block, written when it ends (None: written at once).
_BATCH: ContextVar[list | None] = ContextVar("activity_batch", default=None)


@contextmanager
def activity_batched():
    """Inside the block, which must run inside one transaction, :func:`activity_record` collects its
    rows and they are written in one INSERT when the block ends normally (a block that raises writes
    nothing: its transaction rolls back). Each row keeps the time it was recorded. For work that
    records many rows and never reads them back meanwhile (the connector engine's apply)."""
    batch: list = []
    token = _BATCH.set(batch)
    try:
        yield
    finally:
        _BATCH.reset(token)
    if batch:
        rows.insert_many(batch)


def activity_row(*, actor: Actor, company_id, action: str, entity_type: str, entity_id, details=None,
                 run=None) -> ActivityLog:
    """The audit row :func:`activity_record` writes, unsaved: for a statement that writes its own
    (the checkout's one-statement claim)."""
    fields = actor.activity_fields()
    if run is not None:
        fields["run"] = run
    cause = _CAUSE.get()
    return ActivityLog(
        company_id=company_id,
        action=action,
        entity_type=entity_type,
        entity_id=str(entity_id),
        details={**cause, **(details or {})} if cause else (details or {}),
        **fields,
    )


def activity_deferred() -> bool:
    """Inside :func:`activity_batched`: rows are collected, so a statement must not write its own."""
    return _BATCH.get() is not None


def activity_record(*, actor: Actor, company_id, action: str, entity_type: str, entity_id, details=None, run=None):
    """Append one audit row; call inside the transaction of the change it describes. Inside
    :func:`activity_batched` the row is written when the block ends (its ``pk`` is unset until then)."""
    row = activity_row(actor=actor, company_id=company_id, action=action, entity_type=entity_type,
                       entity_id=entity_id, details=details, run=run)
    batch = _BATCH.get()
    if batch is not None:
        row.created_at = timezone.now()
        batch.append(row)
        return row
    # Every mutation writes one: an INSERT built once, not compiled per row (no one listens to its save)
    return rows.insert(row)
