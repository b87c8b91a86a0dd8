"""Notion state mapping (Appendix A.4): a designated ``status`` or ``select`` property maps its option
names to categories; a database without one is import-only (every page ``backlog``, trashed pages
``terminal``) and cannot run the Symphony profile.

``AdapterConfig.state_mapping``::

    {"property": "Status",                                   # the status/select property (by name)
     "values": {"Not started": "backlog", "In progress": "active", "In review": "review",
                "Done": "terminal"},                         # option name -> category (trim + lowercase)
     "databases": {"<database id>": {"property": "Stage", "values": {...}}}}   # per-database override

An option the mapping does not name is ``backlog`` and reported (``unmappedState``, §7.2). A page whose
database lacks the property, or a page under a page or the workspace, has the import-only default."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..base import StateCategory, normalize_state_name
from ..http import check_categories, norm_names

NO_PROPERTY_STATE = "Open"  # the state name of a page without a mapped property (import-only)
TRASH_STATE = "In trash"
STATE_PROPERTY_TYPES = ("status", "select")


def uuid_key(value: Any) -> str:
    """Notion ids compare without dashes, case-insensitive (payloads spell them dashed)."""
    return str(value or "").strip().replace("-", "").lower()


@dataclass(frozen=True)
class PropertyMapping:
    property: str | None  # None: import-only
    values: dict[str, str] = field(default_factory=dict)  # normalized option name -> category

    @property
    def configured(self) -> bool:
        return bool(self.property)


class StateMapping:
    def __init__(self, raw: Mapping[str, Any] | None):
        raw = raw if isinstance(raw, Mapping) else {}
        self.default = _parse(raw)
        self.databases: dict[str, PropertyMapping] = {}
        overrides = raw.get("databases")
        for key, value in (overrides.items() if isinstance(overrides, Mapping) else ()):
            if isinstance(value, Mapping):
                parsed = _parse(value)
                # an override without its own property keeps the top-level property name
                self.databases[uuid_key(key)] = PropertyMapping(parsed.property or self.default.property,
                                                                parsed.values or dict(self.default.values))

    def for_database(self, database_id: str | None) -> PropertyMapping:
        if database_id and uuid_key(database_id) in self.databases:
            return self.databases[uuid_key(database_id)]
        return self.default

    def any_configured(self) -> bool:
        return self.default.configured or any(m.configured for m in self.databases.values())


def _parse(raw: Mapping[str, Any]) -> PropertyMapping:
    prop = raw.get("property")
    return PropertyMapping(prop.strip() if isinstance(prop, str) and prop.strip() else None,
                           norm_names(raw.get("values")))


def validate(mapping: Any) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}

    def add(field_name: str, reason: str):
        errors.setdefault(field_name, []).append(reason)

    if not isinstance(mapping, Mapping):
        return {"stateMapping": ["must be an object"]}

    def check_block(prefix: str, block: Mapping[str, Any], *, top: bool) -> None:
        allowed = ("property", "values", "databases") if top else ("property", "values")
        for key in block:
            if key not in allowed:
                add(f"{prefix}{key}", f"unknown key; expected {', '.join(allowed)}")
        prop = block.get("property")
        if prop is not None and (not isinstance(prop, str) or not prop.strip()):
            add(f"{prefix}property", "must be the non-empty name of a status or select property")
        values = block.get("values")
        if values is not None and not (prop or (not top and mapping.get("property"))):
            add(f"{prefix}values", "needs 'property': the status or select property these option names belong to")
        check_categories(add, f"{prefix}values", values, shape="option name", names="option names")

    check_block("", mapping, top=True)
    overrides = mapping.get("databases")
    if overrides is not None:
        if not isinstance(overrides, Mapping):
            add("databases", "must be an object {database id: {property, values}}")
        else:
            for key, value in overrides.items():
                if not isinstance(value, Mapping):
                    add(f"databases.{key}", "must be an object with 'property' and/or 'values'")
                else:
                    check_block(f"databases.{key}.", value, top=False)
    return errors


def option_category(mapping: PropertyMapping, name: str) -> str | None:
    category = mapping.values.get(normalize_state_name(name))
    return category if category in StateCategory.ALL else None


def schema_options(schema_property: Mapping[str, Any] | None) -> list[str]:
    """Option names of a database's status/select property schema, in the database's order."""
    if not isinstance(schema_property, Mapping):
        return []
    kind = schema_property.get("type")
    body = schema_property.get(kind) if kind in STATE_PROPERTY_TYPES else None
    options = body.get("options") if isinstance(body, Mapping) else None
    return [str(o.get("name")) for o in options or () if isinstance(o, Mapping) and o.get("name")]


def preferred(category: str, names: list[str], mapped: Callable[[str], str | None]) -> str | None:
    """The first option (database order) mapped to ``category``."""
    return next((n for n in names if mapped(n) == category), None)
