"""Asana task and story (comment) records -> the normalized ExternalTask / ExternalComment.

Tasks: ``external_id`` = task gid (Asana has no human key: ``external_key`` is None); ``title`` = ``name``;
``description`` = ``notes`` (plain text; ``html_notes`` rides in the envelope); ``labels`` = tag names;
``due_at`` = ``due_at`` or ``due_on`` (00:00 UTC); ``url`` = ``permalink_url``; ``updated_at``/``revision``
= ``modified_at``. ``container_id`` = the configured project the task is a member of (``memberships``: a task
can be in several projects; the listing's own project when it is one, else the first configured one in
configuration order). Asana has no priority and the adapter does not read dependencies: ``priority`` None,
``blocked_by`` empty. ``envelope``: memberships, section, completed/completedAt, tags with gids, custom
fields (``customFields``: the routed ids' display values), assignee, html_notes.

Stories: only ``resource_subtype == "comment_added"`` are comments. Asana stories carry no modification
time: ``updated_at`` is ``created_at`` for an unedited comment and None once ``is_edited`` (so the engine
compares the body of an edit instead of a timestamp)."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..base import ExternalActor, ExternalComment, ExternalState, ExternalTask, normalize_labels, web_url
from ..custom_fields import custom_fields
from ..http import note_envelope, parse_due
from ..http import parse_utc as utc
from ..mentions import neutralize_mentions

PROVIDER = "asana"
COMMENT_SUBTYPES = ("comment_added",)
TASK_FIELDS = ",".join((
    "gid", "name", "notes", "html_notes", "completed", "completed_at", "created_at", "modified_at", "due_on",
    "due_at", "assignee.name", "tags.name", "memberships.project.name", "memberships.section.name", "permalink_url",
    "custom_fields.gid", "custom_fields.name", "custom_fields.display_value", "resource_subtype", "parent.gid",
    "workspace.gid", "created_by.gid"))
STATE_FIELDS = "gid,completed,memberships.project.name,memberships.section.name"
STORY_FIELDS = "gid,resource_subtype,type,text,html_text,created_at,created_by.name,is_edited,target.gid"


def memberships(task: Mapping[str, Any]) -> list[dict]:
    """``[{"project": gid, "projectName", "section": gid, "sectionName"}]`` of a task record."""
    out = []
    for m in task.get("memberships") or ():
        if not isinstance(m, Mapping) or not isinstance(m.get("project"), Mapping):
            continue
        section = m.get("section") if isinstance(m.get("section"), Mapping) else {}
        out.append({"project": str(m["project"].get("gid") or ""), "projectName": m["project"].get("name"),
                    "section": str(section.get("gid") or "") or None, "sectionName": section.get("name")})
    return out


def container_of(task: Mapping[str, Any], containers: Iterable[str], prefer: str | None = None) -> dict | None:
    """The membership of ``task`` in a configured project (``prefer`` first), or None."""
    members = {m["project"]: m for m in memberships(task)}
    for gid in ([prefer] if prefer else []) + list(containers):
        if gid and gid in members:
            return members[gid]
    return None


def actor(user: Any, service_account_id: str | None) -> ExternalActor | None:
    if not isinstance(user, Mapping) or not user.get("gid"):
        return None
    gid = str(user["gid"])
    service = (service_account_id or "").strip()
    return ExternalActor(provider_key=PROVIDER, external_user_id=gid, display_name=str(user.get("name") or gid),
                         is_connector_service_account=bool(service) and service == gid)


def task(raw: Mapping[str, Any], *, mapping, containers: tuple[str, ...], service_account_id: str | None,
         wanted_fields: tuple[str, ...] = (), prefer: str | None = None) -> ExternalTask:
    """An Asana task record -> ExternalTask (KeyError/TypeError/ValueError when malformed)."""
    gid = str(raw["gid"])
    if not gid:
        raise ValueError("task without gid")
    member = container_of(raw, containers, prefer)
    project = member["project"] if member else None
    completed = bool(raw.get("completed"))
    name, category, mapped = mapping.state(completed=completed, section=(member or {}).get("sectionName"),
                                           project=project)
    title, t_mentions = neutralize_mentions(str(raw.get("name") or ""))
    notes, d_mentions = neutralize_mentions(raw.get("notes")) if raw.get("notes") else (raw.get("notes"), [])
    tags = [t for t in raw.get("tags") or () if isinstance(t, Mapping)]
    assignee = actor(raw.get("assignee"), service_account_id)
    fields = {str(f.get("gid")): f.get("display_value") for f in raw.get("custom_fields") or ()
              if isinstance(f, Mapping) and f.get("gid")}
    envelope: dict[str, Any] = {
        "memberships": memberships(raw),
        "project": project,
        "section": {"gid": (member or {}).get("section"), "name": (member or {}).get("sectionName")},
        "completed": completed,
        "completedAt": raw.get("completed_at"),
        "tags": [{"gid": t.get("gid"), "name": t.get("name")} for t in tags],
        "customFields": custom_fields(fields, tuple(wanted_fields)),
        "customFieldNames": {gid_: f.get("name") for f in raw.get("custom_fields") or () if isinstance(f, Mapping)
                             for gid_ in [str(f.get("gid"))] if gid_},
        "htmlNotes": raw.get("html_notes"),
        "resourceSubtype": raw.get("resource_subtype"),
        "parent": (raw.get("parent") or {}).get("gid") if isinstance(raw.get("parent"), Mapping) else None,
        "descriptionFormat": "plain",
    }
    note_envelope(envelope, t_mentions + d_mentions, None if mapped else name)
    envelope["stateMapped"] = mapped
    return ExternalTask(
        provider_key=PROVIDER, external_id=gid, external_key=None, title=title or "", description=notes,
        state=ExternalState(name, category), priority=None, assignees=(assignee,) if assignee else (),
        labels=tuple(normalize_labels(str(t.get("name")) for t in tags if t.get("name") is not None)),
        url=web_url(raw.get("permalink_url")), due_at=parse_due(raw.get("due_at") or raw.get("due_on")),
        created_at=utc(raw.get("created_at")), updated_at=utc(raw.get("modified_at")),
        revision=raw.get("modified_at"), container_id=project, envelope=envelope)


def is_comment(story: Mapping[str, Any]) -> bool:
    return story.get("resource_subtype") in COMMENT_SUBTYPES


def comment(story: Mapping[str, Any], task_id: str, *, service_account_id: str | None,
            task_url: str | None = None) -> ExternalComment:
    """An Asana comment story -> ExternalComment."""
    gid = str(story["gid"])
    if not gid:
        raise ValueError("story without gid")
    body, mentions = neutralize_mentions(str(story.get("text") or ""))
    author = actor(story.get("created_by"), service_account_id) or ExternalActor(PROVIDER, "", "Asana")
    created = utc(story.get("created_at"))
    envelope: dict[str, Any] = {"isEdited": bool(story.get("is_edited")), "htmlText": story.get("html_text")}
    if mentions:
        envelope["mentionsNeutralized"] = mentions
    return ExternalComment(external_comment_id=gid, external_task_id=task_id, author=author, body=body or "",
                           url=web_url(task_url), created_at=created, updated_at=None if story.get("is_edited") else created,
                           envelope=envelope)
