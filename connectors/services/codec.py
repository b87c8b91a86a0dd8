"""JSON round-trip of the adapter's normalized shapes, so a stored event can be applied (or
replayed) later without the webhook secret that verified it."""
from __future__ import annotations

import dataclasses
from datetime import datetime
from functools import lru_cache

from django.utils.dateparse import parse_datetime

from connectors.providers.base import (
    ExternalActor,
    ExternalComment,
    ExternalState,
    ExternalTask,
    ExternalTaskRef,
    VerifiedEvent,
    web_url,
)


_SCALARS = (str, int, float, type(None))  # (bool is an int)


@lru_cache(maxsize=None)
def _field_names(cls) -> tuple:
    return tuple(f.name for f in dataclasses.fields(cls))


def _plain(value):
    if isinstance(value, _SCALARS):  # most leaves: answered first (every stored event walks its tree)
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    if dataclasses.is_dataclass(value):
        return {name: _plain(getattr(value, name)) for name in _field_names(type(value))}
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    return value


def dump(obj) -> dict | None:
    return None if obj is None else _plain(obj)


def _dt(value):
    return parse_datetime(value) if isinstance(value, str) and value else None


def actor_load(data) -> ExternalActor | None:
    if not data:
        return None
    return ExternalActor(provider_key=data.get("provider_key", ""), external_user_id=str(data.get("external_user_id", "")),
                         display_name=data.get("display_name", ""),
                         is_connector_service_account=bool(data.get("is_connector_service_account")),
                         mapped_user_id=data.get("mapped_user_id"), mapped_agent_id=data.get("mapped_agent_id"))


def task_load(data) -> ExternalTask | None:
    if not data:
        return None
    state = data.get("state") or {}
    return ExternalTask(
        provider_key=data["provider_key"], external_id=str(data["external_id"]), external_key=data.get("external_key"),
        title=data.get("title") or "", description=data.get("description"),
        state=ExternalState(name=state.get("name", ""), category=state.get("category", "backlog")),
        priority=data.get("priority"),
        assignees=tuple(actor_load(a) for a in data.get("assignees") or ()),
        labels=tuple(data.get("labels") or ()),
        blocked_by=tuple(ExternalTaskRef(**b) for b in data.get("blocked_by") or ()),
        # web_url again: an event stored before adapters filtered URLs must not bring a script URL back on replay
        url=web_url(data.get("url")), branch_name=data.get("branch_name"), due_at=_dt(data.get("due_at")),
        created_at=_dt(data.get("created_at")), updated_at=_dt(data.get("updated_at")),
        revision=data.get("revision"), container_id=data.get("container_id"), envelope=data.get("envelope") or {},
    )


def comment_load(data) -> ExternalComment | None:
    if not data:
        return None
    return ExternalComment(
        external_comment_id=str(data["external_comment_id"]), external_task_id=str(data["external_task_id"]),
        author=actor_load(data.get("author")), body=data.get("body") or "", url=web_url(data.get("url")),
        created_at=_dt(data.get("created_at")), updated_at=_dt(data.get("updated_at")),
        envelope=data.get("envelope") or {},
    )


def event_load(data) -> VerifiedEvent:
    return VerifiedEvent(
        event_id=data["event_id"], kind=data["kind"], action=data.get("action") or "",
        external_task_id=data.get("external_task_id"), occurred_at=_dt(data.get("occurred_at")),
        task=task_load(data.get("task")), comment=comment_load(data.get("comment")),
        actor=actor_load(data.get("actor")), container_id=data.get("container_id"),
        trusted_content=data.get("trusted_content", True), sparse=data.get("sparse", False),
    )
