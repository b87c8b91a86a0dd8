"""Read-back of unverifiable deliveries (External Task Protocol §5.1.5, §14.2).

A delivery the connector could not verify (an instance without a webhook secret: Jira webhooks may
be unsigned; the adapter marks them ``trusted_content=False``) is a *hint*. It may say which task
(and which comment) to look at; it never says what changed. :func:`confirm` reads the task — and
for comment events the task's comments — back through the adapter with the connector's own
credentials and returns an event that carries only what the provider's API returned, or no event
when the API does not confirm the hint:

* task created/updated: the API's task (``get_task``); a task the API does not have (404, or moved
  out of the connector's containers) confirms nothing;
* task deleted: confirmed only when ``get_task`` says the task is gone;
* comment created/edited: the API's comment (``list_comments``: body, author, timestamps), found by
  id on the task; a comment id the task does not have confirms nothing;
* comment deleted: confirmed only when the comment is no longer on the task (or the task is gone).

The delivered actor is dropped (a task read-back carries no actor, like a polled observation; a
comment carries its API author). Any other provider error propagates unchanged: the engine retries
the event like every failed apply and parks it after the bounded count; it never falls back to the
delivered body. No database access here: an adapter and a normalized event in, an event out."""
from __future__ import annotations

from dataclasses import dataclass, replace

from connectors.providers.base import (
    ErrorCategory,
    EventKind,
    ExternalComment,
    ExternalTask,
    ExternalTaskRef,
    ProviderError,
    TaskSourceAdapter,
    VerifiedEvent,
)

MAX_COMMENT_PAGES = 50


@dataclass(frozen=True)
class ReadBack:
    """``event``: the confirmed event (``trusted_content=True``), or None when the API did not confirm
    the hint; ``note``: what the read showed (kept on the inbound event row)."""

    event: VerifiedEvent | None
    note: str

    @property
    def confirmed(self) -> bool:
        return self.event is not None


def _gone(exc: ProviderError) -> bool:
    return exc.status == 404


def _task(adapter: TaskSourceAdapter, ref: ExternalTaskRef) -> ExternalTask | None:
    try:
        return adapter.get_task(ref)
    except ProviderError as exc:
        if _gone(exc):
            return None
        raise


def _comment(adapter: TaskSourceAdapter, ref: ExternalTaskRef, comment_id: str,
             max_pages: int) -> tuple[ExternalComment | None, bool]:
    """(the comment as the API has it or None, whether the task itself is gone)."""
    cursor = None
    for _ in range(max_pages):
        try:
            page = adapter.list_comments(ref, cursor)
        except ProviderError as exc:
            if _gone(exc):
                return None, True
            raise
        for item in page.items:
            if str(item.external_comment_id) == comment_id:
                return item, False
        if not page.cursor or not page.items:
            return None, False
        cursor = page.cursor
    raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD,
                        f"Comment {comment_id} not found within {max_pages} pages of comments.")


def confirm(adapter: TaskSourceAdapter, event: VerifiedEvent, *, external_key: str | None = None,
            max_comment_pages: int = MAX_COMMENT_PAGES) -> ReadBack:
    """Confirm the hint ``event`` by reading back through ``adapter``. ``external_key``: the task's key
    as the engine already knows it (its link), preferred over the delivered one."""
    task_id = str(event.external_task_id or "")
    if not task_id or event.kind not in (EventKind.TASK_UPSERTED, EventKind.TASK_DELETED,
                                         EventKind.COMMENT_UPSERTED, EventKind.COMMENT_DELETED):
        return ReadBack(None, "the delivery names no task to read back")
    delivered_key = event.task.external_key if event.task is not None else None
    task = _task(adapter, ExternalTaskRef(external_id=task_id, external_key=external_key or delivered_key))
    if task is not None and str(task.external_id) != task_id:
        return ReadBack(None, f"the delivered key names another task ({task.external_key or task.external_id})")

    def confirmed(**more) -> VerifiedEvent:
        return replace(event, **({"trusted_content": True, "sparse": False, "task": task, "actor": None,
                                  "container_id": task.container_id if task is not None else event.container_id}
                                 | more))

    if event.kind == EventKind.TASK_DELETED:
        if task is not None:
            return ReadBack(None, f"the task still exists ({task.external_key or task_id})")
        return ReadBack(confirmed(), "the task is gone")
    if event.kind == EventKind.TASK_UPSERTED:
        if task is None:
            return ReadBack(None, "the provider has no such task")
        return ReadBack(confirmed(occurred_at=task.updated_at or event.occurred_at),
                        f"read {task.external_key or task_id}")

    comment_id = str(event.comment.external_comment_id) if event.comment is not None else ""
    if not comment_id:
        return ReadBack(None, "the delivery names no comment")
    if task is None:
        if event.kind == EventKind.COMMENT_DELETED:
            return ReadBack(confirmed(), "the task (and its comments) is gone")
        return ReadBack(None, "the provider has no such task")
    found, task_gone = _comment(adapter, ExternalTaskRef(external_id=task.external_id, external_key=task.external_key),
                                comment_id, max_comment_pages)
    if event.kind == EventKind.COMMENT_DELETED:
        if found is not None:
            return ReadBack(None, f"comment {comment_id} still exists")
        # only the id of the delivered comment is used from here on (the deletion record)
        return ReadBack(confirmed(), f"comment {comment_id} is gone")
    if found is None:
        return ReadBack(None, "the provider has no such task" if task_gone else
                        f"task {task.external_key or task_id} has no comment {comment_id}")
    return ReadBack(confirmed(comment=found, actor=found.author, occurred_at=found.updated_at or event.occurred_at),
                    f"read comment {comment_id} of {task.external_key or task_id}")
