"""Notion page and comment objects -> the normalized ExternalTask / ExternalComment (§4.1.1, §5.3): title,
description (a rich text property and/or the page content, Markdown best effort), state under the
instance's mapping, assignees, labels, due date, and the envelope (A.4: property schema snapshot,
select/status values, relations, block references). A mixin of :class:`connectors.providers.notion.NotionAdapter`:
it reads ``self.config``, ``self._mapping``, ``self.options`` and, for user names and content, ``self.api``."""
from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

from ..base import ErrorCategory, ExternalActor, ExternalComment, ExternalState, ExternalTask, ProviderError, StateCategory
from ..base import normalize_labels, web_url
from ..http import mapped_state, note_envelope, parse_due, parse_utc
from ..mentions import neutralize_mentions
from . import richtext, states
from .client import MAX_PAGE_SIZE
from .states import NO_PROPERTY_STATE, TRASH_STATE, uuid_key

DEFAULT_NAMES = {"assigneeProperty": ("assignee", "assignees", "owner"), "labelsProperty": ("tags", "labels"),
                 "dueProperty": ("due", "due date"), "priorityProperty": ("priority",)}


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


class NotionNormalizer:
    # --- users -----------------------------------------------------------------------------------
    def _user_name(self, user: Mapping[str, Any] | None) -> tuple[str, str]:
        """(id, display name) of a user reference; the name is read once per adapter when absent."""
        user = user if isinstance(user, Mapping) else {}
        uid = str(user.get("id") or "")
        if user.get("name"):
            self._users[uid] = str(user["name"])
        if uid and uid not in self._users:
            try:
                self._users[uid] = str(self.api("GET", f"/users/{uid}").get("name") or uid)
            except ProviderError as exc:
                if exc.category == ErrorCategory.PROVIDER_RATE_LIMITED:
                    raise
                self._users[uid] = uid  # no user-information capability, or a deleted user: the id it is
        return uid, self._users.get(uid, uid) or "Notion user"

    def _actor(self, user: Mapping[str, Any] | None) -> ExternalActor:
        uid, name = self._user_name(user)
        service = (self.config.service_account_id or "").strip()
        return ExternalActor(provider_key=self.provider_key, external_user_id=uid, display_name=name,
                             is_connector_service_account=bool(service) and uid == service)

    # --- normalization ---------------------------------------------------------------------------
    @staticmethod
    def _prop(props: Mapping[str, Any], name: str | None, kind: str | tuple | None = None):
        """(name, value) of a page property by name (exact, then case-insensitive), optionally of a type."""
        if not name:
            return None, None
        kinds = (kind,) if isinstance(kind, str) else kind
        for key in sorted(props, key=lambda k: k != name):
            value = props[key]
            if (key == name or key.strip().lower() == name.strip().lower()) and isinstance(value, Mapping) and \
                    (kinds is None or value.get("type") in kinds):
                return key, value
        return None, None

    def _named(self, props: Mapping[str, Any], option: str, kind: str):
        configured = self._option(option)
        if configured:
            return self._prop(props, configured, kind)
        for name in DEFAULT_NAMES[option]:
            found = self._prop(props, name, kind)
            if found[0]:
                return found
        return None, None

    def _state(self, page: Mapping[str, Any]) -> tuple[ExternalState, str | None, dict]:
        """(state, unmapped name, envelope facts) of a page under the instance's mapping."""
        if page.get("in_trash") or page.get("archived"):
            return ExternalState(TRASH_STATE, StateCategory.TERMINAL), None, {"stateProperty": None}
        kind, pid = self._parent(page)
        mapping = self._mapping.for_database(pid if kind == "database" else None) if kind == "database" else None
        props = page.get("properties") if isinstance(page.get("properties"), Mapping) else {}
        name, value = self._prop(props, mapping.property if mapping else None, states.STATE_PROPERTY_TYPES)
        if not name:
            # import-only: no designated property (or this database lacks it) -> backlog, mapped by default
            return ExternalState(NO_PROPERTY_STATE, StateCategory.BACKLOG), None, {"stateProperty": None}
        option = value.get(value.get("type")) if isinstance(value.get(value.get("type")), Mapping) else {}
        option_name = str(option.get("name") or "")
        facts = {"stateProperty": name, "stateValue": {"type": value.get("type"), "id": option.get("id"),
                                                       "name": option_name or None}}
        if not option_name:
            return ExternalState(f"No {name}", StateCategory.BACKLOG), None, facts
        state, unmapped = mapped_state(option_name, states.option_category(mapping, option_name))
        return state, unmapped, facts

    def _content(self, page_id: str) -> tuple[list[dict], bool]:
        data = self.api("GET", f"/blocks/{page_id}/children", params={"page_size": MAX_PAGE_SIZE})
        rows, more = self.results(data, "Notion page content")
        return rows, more is not None

    def row_mark(self, page: Mapping[str, Any]) -> str:
        """What identifies one version of a listed row (its page-level fields), for the cursor's ``seen``."""
        return digest([page.get("properties"), page.get("in_trash"), page.get("archived"),
                        (page.get("child_page") or {}).get("title")])

    def normalize_page(self, page: Mapping[str, Any], blocks: list | None = None,
                       truncated: bool = False) -> ExternalTask:
        """A page object (+ its top-level blocks when read) -> ExternalTask (KeyError/TypeError when malformed)."""
        page_id = str(page["id"])
        props = page["properties"]
        if not isinstance(props, Mapping):
            raise TypeError("properties is not an object")
        title_name, title_value = next(((k, v) for k, v in props.items() if isinstance(v, Mapping)
                                        and v.get("type") == "title"), (None, None))
        title, t_mentions = neutralize_mentions(richtext.plain((title_value or {}).get("title")))
        state, unmapped, facts = self._state(page)
        parts, mentioned, lossy = [], [], []
        desc_name, desc_value = self._prop(props, self._option("descriptionProperty"), "rich_text")
        if desc_name:
            text, names = richtext.to_markdown(desc_value.get("rich_text"))
            parts.append(text)
            mentioned += names
        block_refs = None
        if blocks is not None:
            text, names, lossy = richtext.blocks_markdown(blocks)
            parts.append(text)
            mentioned += names
            block_refs = [{"id": b.get("id"), "type": b.get("type")} for b in blocks if isinstance(b, Mapping)]
            if truncated:
                lossy.append(f"only the first {MAX_PAGE_SIZE} blocks are read")
        description, d_mentions = neutralize_mentions("\n\n".join(p for p in parts if p).strip() or None)
        people_name, people = self._named(props, "assigneeProperty", "people")
        assignees = tuple(self._actor(u) for u in (people or {}).get("people") or () if isinstance(u, Mapping))
        labels_name, labels = self._named(props, "labelsProperty", "multi_select")
        label_names = [str(o.get("name")) for o in (labels or {}).get("multi_select") or ()
                       if isinstance(o, Mapping) and o.get("name")]
        due_name, due = self._named(props, "dueProperty", "date")
        prio_name, prio = self._named(props, "priorityProperty", "select")
        kind, pid = self._parent(page)
        container = self._page_container(page)
        edited = page.get("last_edited_time")
        envelope: dict[str, Any] = {
            "parent": {"type": kind, "id": pid}, "databaseId": pid if kind == "database" else None,
            "propertySchema": {k: {"id": v.get("id"), "type": v.get("type")} for k, v in props.items()
                               if isinstance(v, Mapping)},
            "selectValues": {k: (v.get(v["type"]) or {}).get("name") if v.get("type") in ("select", "status")
                             else [o.get("name") for o in v.get("multi_select") or () if isinstance(o, Mapping)]
                             for k, v in props.items() if isinstance(v, Mapping)
                             and v.get("type") in ("select", "status", "multi_select")},
            "relations": {k: [r.get("id") for r in v.get("relation") or () if isinstance(r, Mapping)]
                          for k, v in props.items() if isinstance(v, Mapping) and v.get("type") == "relation"},
            "priority": ((prio or {}).get("select") or {}).get("name") if prio_name else None,
            "titleProperty": title_name, "inTrash": bool(page.get("in_trash") or page.get("archived")),
            "descriptionFormat": "markdown", "descriptionSources": (["property:" + desc_name] if desc_name else [])
            + (["content"] if blocks is not None else []),
            **facts,
        }
        if block_refs is not None:
            envelope["blocks"] = block_refs
        if lossy:
            envelope["descriptionLossy"] = lossy
        note_envelope(envelope, list(mentioned) + t_mentions + d_mentions, unmapped)
        envelope["stateMapped"] = unmapped is None
        return ExternalTask(
            provider_key=self.provider_key, external_id=page_id, external_key=None, title=title or "",
            description=description, state=state, priority=None, assignees=assignees,
            labels=tuple(normalize_labels(label_names)), blocked_by=(), url=web_url(page.get("url")),
            due_at=parse_due(((due or {}).get("date") or {}).get("start")) if due_name else None,
            created_at=parse_utc(page.get("created_time")), updated_at=parse_utc(edited),
            revision=f"{edited}#{digest([self.row_mark(page), description])}",
            container_id=container or pid, envelope=envelope)

    def _full(self, page: Mapping[str, Any]) -> ExternalTask:
        if self.read_content:
            blocks, truncated = self._content(str(page["id"]))
            return self.normalize_page(page, blocks, truncated)
        return self.normalize_page(page)

    def normalize_comment(self, comment: Mapping[str, Any], page_id: str, page_url: str | None = None) -> ExternalComment:
        body, mentioned = richtext.to_markdown(comment.get("rich_text"))
        body, more = neutralize_mentions(body)
        author = self._actor(comment.get("created_by"))
        discussion = uuid_key(comment.get("discussion_id"))
        base = page_url or f"https://www.notion.so/{uuid_key(page_id)}"
        envelope: dict[str, Any] = {"discussionId": comment.get("discussion_id"), "parent": comment.get("parent")}
        if mentioned or more:
            envelope["mentionsNeutralized"] = list(dict.fromkeys(mentioned + more))
        return ExternalComment(
            external_comment_id=str(comment["id"]), external_task_id=page_id, author=author, body=body or "",
            url=web_url(f"{base}?d={discussion}" if discussion else base), created_at=parse_utc(comment.get("created_time")),
            updated_at=parse_utc(comment.get("last_edited_time")), envelope=envelope)
