"""Provider custom field values as routing reads them (§8.1 ``custom_field``, Appendix A.2 "custom fields by
id"): ``envelope["customFields"]`` maps a field id to its text, or to a list of texts for a multi-valued
field. Providers hand over their raw values; the shapes below are the ones trackers use (Jira: plain
text/number, a select option ``{"value": ...}``, a user ``{"displayName": ...}``, a version or component
``{"name": ...}``, an ADF document for a paragraph field, lists of those for multi-selects)."""
from __future__ import annotations

from typing import Any, Mapping

from . import adf

NAMED_KEYS = ("value", "name", "displayName", "key")  # the readable part of an option/user/version object


def field_text(value: Any) -> str | list[str] | None:
    """The text of one raw custom field value; ``None`` when it is empty."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"{value:g}" if isinstance(value, float) else str(value)
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, Mapping):
        if value.get("type") == "doc":
            return adf.plain_text(value).strip() or None
        for key in NAMED_KEYS:
            text = value.get(key)
            if isinstance(text, (str, int, float)) and not isinstance(text, bool) and str(text).strip():
                return str(text).strip()
        return None
    if isinstance(value, (list, tuple)):
        texts: list[str] = []
        for item in value:
            text = field_text(item)
            texts.extend(text if isinstance(text, list) else [text] if text else [])
        return texts or None
    return None


def custom_fields(raw_fields: Mapping[str, Any], wanted: tuple[str, ...]) -> dict[str, str | list[str]]:
    """``{id: text}`` for the ``wanted`` ids that carry a value. Only the wanted ids are kept, so a webhook
    (which carries every field) and an API read (which asks for the wanted ones) give the same map, and a
    change of an unrelated field never looks like a change of routing input."""
    out = {}
    for field_id in wanted:
        text = field_text(raw_fields.get(field_id)) if isinstance(raw_fields, Mapping) else None
        if text:
            out[field_id] = text
    return out
