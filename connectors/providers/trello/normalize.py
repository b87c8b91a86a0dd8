"""Trello cards and comment actions -> the normalized shapes (§4.1).

``external_id`` is the card id (24 hex, stable across list and board moves), ``external_key`` the card's
``shortLink`` (what ``https://trello.com/c/<shortLink>`` shows), ``container_id`` the board id as
configured. Trello has no priority and no blockers: ``priority`` is None and ``blocked_by`` empty; the raw
values (``pos``, ``idList``, ``idMembers``, ``idChecklists``, ``labels``, ``badges``) ride in the envelope.
Labels: a label's name, or its colour for an unnamed label ("green"), lowercased. Assignees: the card's
members (``members=true``). ``created_at`` comes from the card id (its first 8 hex digits are the creation
time), ``updated_at``/``revision`` from ``dateLastActivity``. ``@username`` mentions are neutralized.

A comment is a ``commentCard`` action: its id is the action id, its body ``data.text`` (Markdown), its
``updated_at`` ``data.dateLastEdited`` after an edit, else the action ``date``."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Mapping

from ..base import ExternalActor, ExternalComment, ExternalTask, normalize_labels, web_url
from ..http import note_envelope, parse_utc
from ..mentions import neutralize_mentions
from .states import ListMapping

PROVIDER_KEY = "trello"


def created_from_id(object_id: Any) -> datetime | None:
    """A Trello id starts with its creation time (epoch seconds, 8 hex digits)."""
    try:
        return datetime.fromtimestamp(int(str(object_id)[:8], 16), tz=timezone.utc)
    except (TypeError, ValueError, OverflowError):
        return None


def card_url(card: Mapping[str, Any]) -> str | None:
    if card.get("url") or card.get("shortUrl"):
        return str(card.get("url") or card.get("shortUrl"))
    return f"https://trello.com/c/{card['shortLink']}" if card.get("shortLink") else None


def label_names(labels: Any) -> list[str]:
    out = []
    for label in labels or ():
        if isinstance(label, Mapping):
            text = str(label.get("name") or "").strip() or str(label.get("color") or "").strip()
            if text:
                out.append(text)
    return out


class TrelloNormalizer:
    """Normalization with the instance's view: containers, mapping, service account."""

    _mapping: ListMapping
    _containers: dict[str, str]

    def actor(self, member: Mapping[str, Any] | None, *, login: bool = False) -> ExternalActor | None:
        """``login``: display the username (assignees, so ``user_mapping`` rules can name logins)."""
        if not isinstance(member, Mapping) or not (member.get("id") or member.get("username")):
            return None
        uid = str(member.get("id") or member.get("username"))
        username, full = str(member.get("username") or ""), str(member.get("fullName") or "")
        name = (username or full or uid) if login else (full or username or uid)
        service = (self.config.service_account_id or "").strip().lower()
        is_service = bool(service) and service in (uid.lower(), username.lower())
        return ExternalActor(provider_key=PROVIDER_KEY, external_user_id=uid, display_name=name,
                             is_connector_service_account=is_service)

    def container_of(self, board_id: Any) -> str | None:
        """The configured spelling of a board id, or None when it is not a container."""
        return self._containers.get(str(board_id or "").strip().lower())

    def normalize_card(self, card: Mapping[str, Any], lists: Mapping[str, Mapping] | None = None) -> ExternalTask:
        """A REST card (``fields`` as :data:`connectors.providers.trello.CARD_FIELDS`, ``members=true``) ->
        ExternalTask. ``lists``: list id -> list (``name``), to name the lane. KeyError when malformed."""
        card_id = str(card["id"])
        board_id = str(card.get("idBoard") or "")
        list_id = str(card.get("idList") or "")
        lst = (lists or {}).get(list_id) or (card.get("list") if isinstance(card.get("list"), Mapping) else {}) or {}
        closed = bool(card.get("closed"))
        state, unmapped = self._mapping.state(closed=closed, list_id=list_id, list_name=lst.get("name"),
                                              board_id=board_id)
        title, t_mentions = neutralize_mentions(str(card.get("name") or ""))
        description, d_mentions = neutralize_mentions(card.get("desc")) if card.get("desc") else (card.get("desc"), [])
        raw_labels = [lbl for lbl in card.get("labels") or () if isinstance(lbl, Mapping)]
        members = [m for m in card.get("members") or () if isinstance(m, Mapping)]
        assignees = [self.actor(m, login=True) for m in members]
        if not members:  # fields without members=true: ids only
            assignees = [ExternalActor(PROVIDER_KEY, str(mid), str(mid)) for mid in card.get("idMembers") or ()]
        envelope: dict[str, Any] = {
            "shortLink": card.get("shortLink"), "idShort": card.get("idShort"),
            "board": {"id": board_id or None},
            "list": {"id": list_id or None, "name": lst.get("name"), "closed": lst.get("closed")},
            "closed": closed, "pos": card.get("pos"), "idList": list_id or None,
            "idMembers": list(card.get("idMembers") or []), "idLabels": list(card.get("idLabels") or []),
            "labels": [{"id": lbl.get("id"), "name": lbl.get("name"), "color": lbl.get("color")} for lbl in raw_labels],
            "idChecklists": list(card.get("idChecklists") or []), "badges": card.get("badges"),
            "due": card.get("due"), "dueComplete": card.get("dueComplete"), "start": card.get("start"),
            "priority": None, "blockedBy": None,  # Trello has neither (§4.1.1: null, not guessed)
            "descriptionFormat": "markdown",
        }
        note_envelope(envelope, t_mentions + d_mentions, unmapped)
        envelope["stateMapped"] = unmapped is None
        return ExternalTask(
            provider_key=PROVIDER_KEY, external_id=card_id, external_key=card.get("shortLink") or None,
            title=title or "", description=description, state=state, priority=None,
            assignees=tuple(a for a in assignees if a), labels=tuple(normalize_labels(label_names(raw_labels))),
            blocked_by=(), url=web_url(card_url(card)), due_at=parse_utc(card.get("due")),
            created_at=created_from_id(card_id), updated_at=parse_utc(card.get("dateLastActivity")),
            revision=card.get("dateLastActivity"), container_id=self.container_of(board_id) or board_id or None,
            envelope=envelope)

    def normalize_comment(self, action: Mapping[str, Any], card_id: str | None = None) -> ExternalComment:
        """A ``commentCard`` action (REST or webhook) -> ExternalComment (KeyError when malformed)."""
        data = action.get("data") if isinstance(action.get("data"), Mapping) else {}
        card = data.get("card") if isinstance(data.get("card"), Mapping) else {}
        task_id = str(card_id or card["id"])
        body, mentions = neutralize_mentions(str(data.get("text") or ""))
        author = self.actor(action.get("memberCreator")) or (
            self.actor({"id": action["idMemberCreator"]}) if action.get("idMemberCreator") else None) or \
            ExternalActor(PROVIDER_KEY, "", "Trello")
        created = parse_utc(action.get("date"))
        edited = parse_utc(data.get("dateLastEdited"))
        url = f"https://trello.com/c/{card['shortLink']}#comment-{action['id']}" if card.get("shortLink") else None
        envelope: dict[str, Any] = {"actionType": action.get("type"), "dateLastEdited": data.get("dateLastEdited")}
        if mentions:
            envelope["mentionsNeutralized"] = mentions
        return ExternalComment(external_comment_id=str(action["id"]), external_task_id=task_id, author=author,
                               body=body or "", url=web_url(url), created_at=created, updated_at=edited or created,
                               envelope=envelope)
