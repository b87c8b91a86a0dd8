"""Which outside URLs may become a link: one rule for the console (the ``web_link`` filter) and for
what connectors store (``connectors.providers.base.web_url``).

Tracker payloads, runners and agents hand us URLs that end up in ``href``; a ``javascript:`` or
``data:`` URL there runs script in an operator's session. Only an absolute http(s) URL passes; anything
else is dropped, never repaired."""
from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

WEB_SCHEMES = frozenset({"http", "https"})


def web_url(value: Any) -> str:
    """``value`` when it is an absolute http(s) URL with a host, else ``""``."""
    if not isinstance(value, str) or not value or value != value.strip():
        return ""  # browsers strip surrounding whitespace before reading the scheme: refuse, do not guess
    try:
        parts = urlsplit(value)
    except ValueError:  # e.g. an invalid IPv6 literal
        return ""
    return value if parts.scheme.lower() in WEB_SCHEMES and parts.netloc else ""
