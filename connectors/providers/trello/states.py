"""Trello lanes: which list means which category (state mapping), and the optional narrowing of a board
to some of its lists (instance ``config["lists"]``).

State mapping (``AdapterConfig.state_mapping``, configuration, not code)::

    {
      "lists":   {"To Do": "backlog", "Doing": "active", "Paperclip: QA": "review", "Done": "terminal"},
      "listIds": {"5f0c...24 hex": "blocked"},                          # by list id: survives a rename
      "boards":  {"<board id>": {"lists": {...}, "listIds": {...}}}     # per-board overrides
    }

List names compare trimmed and lowercased. Lookup: board ``listIds`` -> ``listIds`` -> board ``lists`` ->
``lists``. An archived card (``closed: true``) is ``terminal`` whatever its list (state name
:data:`ARCHIVED`). Without any list named in the mapping every open card is ``backlog`` (the default
that imports without configuration); once the mapping names lists, a list it does not name is
``backlog`` and reported as unmapped (§7.2, never guessed).

Narrowing (``config["lists"]``): ``{"<board id>": ["<list id or name>", ...]}`` — only cards in those
lists are the connector's; a card that leaves them is treated like one that left the board."""
from __future__ import annotations

import re
from typing import Any, Callable, Mapping

from ..base import ExternalState, StateCategory, normalize_state_name
from ..http import check_categories, check_overrides, norm_names

ARCHIVED = "Archived"  # the state name of a closed (archived) card; update_task_state("Archived") archives
MAPPING_KEYS = ("lists", "listIds", "boards")
TRELLO_ID = re.compile(r"^[0-9a-fA-F]{24}$")


def _ids(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k).strip().lower(): normalize_state_name(v) for k, v in value.items() if isinstance(v, str)}


class ListMapping:
    def __init__(self, raw: Mapping[str, Any] | None):
        raw = raw if isinstance(raw, Mapping) else {}
        self.lists = norm_names(raw.get("lists"))
        self.list_ids = _ids(raw.get("listIds"))
        self.boards: dict[str, tuple[dict, dict]] = {}
        boards = raw.get("boards") if isinstance(raw.get("boards"), Mapping) else {}
        for board, value in boards.items():
            if isinstance(value, Mapping):
                self.boards[str(board).strip().lower()] = (norm_names(value.get("lists")), _ids(value.get("listIds")))

    @property
    def empty(self) -> bool:
        """No list is named anywhere: the built-in default (open -> backlog) applies."""
        return not (self.lists or self.list_ids or any(a or b for a, b in self.boards.values()))

    def category(self, list_id: str | None, list_name: str | None, board_id: str | None) -> str | None:
        lid, name = str(list_id or "").strip().lower(), normalize_state_name(list_name)
        names, ids = self.boards.get(str(board_id or "").strip().lower(), ({}, {}))
        for table, key in ((ids, lid), (self.list_ids, lid), (names, name), (self.lists, name)):
            if key and key in table:
                return table[key]
        return None

    def maps_category(self, category: str) -> bool:
        tables = [self.lists, self.list_ids] + [t for pair in self.boards.values() for t in pair]
        return any(category in table.values() for table in tables)

    def state(self, *, closed: bool, list_id: str | None, list_name: str | None,
              board_id: str | None) -> tuple[ExternalState, str | None]:
        """(state, unmapped list name or None)."""
        if closed:
            return ExternalState(ARCHIVED, StateCategory.TERMINAL), None
        name = str(list_name or list_id or "unknown list")
        category = self.category(list_id, list_name, board_id)
        if category in StateCategory.ALL:
            return ExternalState(name, category), None
        if self.empty:
            return ExternalState(name, StateCategory.BACKLOG), None
        return ExternalState(name, StateCategory.BACKLOG), name


def mapping_errors(mapping: Any) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}

    def add(field_name, reason):
        errors.setdefault(field_name, []).append(reason)

    def check_names(prefix, value):
        check_categories(add, prefix, value, shape="list name", names="list names")

    def check_ids(prefix, value):
        if value is None:
            return
        if not isinstance(value, Mapping):
            add(prefix, "must be an object {list id: category}")
            return
        for key in value:
            if not isinstance(key, str) or not TRELLO_ID.match(key.strip()):
                add(f"{prefix}.{key}", "a Trello list id is 24 hex digits (the list's id, not its name)")
        check_categories(add, prefix, {k: v for k, v in value.items() if isinstance(k, str)
                                       and TRELLO_ID.match(k.strip())}, shape="list id")

    if not isinstance(mapping, Mapping):
        return {"stateMapping": ["must be an object"]}
    for key, value in mapping.items():
        if key == "lists":
            check_names("lists", value)
        elif key == "listIds":
            check_ids("listIds", value)
        elif key == "boards":
            check_overrides(add, "boards", value, "board id", {"lists": check_names, "listIds": check_ids})
        else:
            add(key, "unknown key; expected lists, listIds, boards (an archived card is always terminal)")
    return errors


class Narrowing:
    """``config["lists"]``: the lists of a board that are the connector's (absent: the whole board)."""

    def __init__(self, options: Mapping[str, Any] | None):
        raw = (options or {}).get("lists") if isinstance(options, Mapping) else None
        self.boards: dict[str, set[str]] = {}
        for board, lists in (raw.items() if isinstance(raw, Mapping) else ()):
            if isinstance(lists, (list, tuple)):
                self.boards[str(board).strip().lower()] = {str(v).strip().lower() for v in lists if str(v).strip()} | {
                    normalize_state_name(v) for v in lists if isinstance(v, str) and v.strip()}

    def narrowed(self, board_id: str | None) -> bool:
        return str(board_id or "").strip().lower() in self.boards

    def allows(self, board_id: str | None, list_id: str | None, list_name: str | None = None) -> bool:
        wanted = self.boards.get(str(board_id or "").strip().lower())
        if wanted is None:
            return True
        return str(list_id or "").strip().lower() in wanted or (
            bool(list_name) and normalize_state_name(list_name) in wanted)


def narrowing_errors(options: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """What is wrong with ``config["lists"]`` (refused by the instance service through ``config_errors``)."""
    raw = (options or {}).get("lists") if isinstance(options, Mapping) else None
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        return {"config.lists": ["must be an object {board id: [list id or name, ...]}"]}
    errors: dict[str, list[str]] = {}
    for board, lists in raw.items():
        if not TRELLO_ID.match(str(board).strip()):
            errors.setdefault(f"config.lists.{board}", []).append("a Trello board id is 24 hex digits")
        if not isinstance(lists, (list, tuple)) or not lists or not all(isinstance(v, str) and v.strip() for v in lists):
            errors.setdefault(f"config.lists.{board}", []).append("must be a non-empty list of list ids or names")
    return errors


def first_mapped(lists: list[Mapping], category: str, mapping: ListMapping, board_id: str,
                 allowed: Callable[[Mapping], bool] = lambda row: True) -> str | None:
    """The name of the first open list (board order) mapped to ``category``."""
    for row in sorted(lists, key=lambda r: (float(r.get("pos") or 0), str(r.get("id")))):
        if row.get("closed") or not allowed(row):
            continue
        if mapping.category(row.get("id"), row.get("name"), board_id) == category:
            return str(row.get("name"))
    return None
