"""Mention neutralizing for imported external text (every provider): ``@name`` never pings anyone
in Paperclip or back in a tracker, and the names found are reported in the envelope."""
from __future__ import annotations

import re

WORD_JOINER = "\u2060"
# "@" not preceded by a word char, "@" or "/" (so e-mail addresses and "a@b" stay), then a name.
_MENTION_RE = re.compile(r"(?<![\w@/])@([A-Za-z0-9](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?(?:/[A-Za-z0-9_.-]+)?)")
_CODE_RE = re.compile(r"(^|\n)(```|~~~)[^\n]*\n.*?(?:\n\2[^\n]*(?=\n|$)|$)|`+[^`\n]*`+", re.S)


def neutralize_mentions(text: str | None) -> tuple[str | None, list[str]]:
    """``@name`` -> ``name`` outside code; ``@`` + WORD JOINER inside code spans/fences."""
    if not text:
        return text, []
    found: list[str] = []

    def plain(segment: str) -> str:
        def repl(m):
            found.append(m.group(1))
            return m.group(1)

        return _MENTION_RE.sub(repl, segment)

    def in_code(segment: str) -> str:
        def repl(m):
            found.append(m.group(1))
            return "@" + WORD_JOINER + m.group(1)

        return _MENTION_RE.sub(repl, segment)

    out, pos = [], 0
    for m in _CODE_RE.finditer(text):
        out.append(plain(text[pos:m.start()]))
        out.append(in_code(m.group(0)))
        pos = m.end()
    out.append(plain(text[pos:]))
    seen, unique = set(), []
    for name in found:
        if name.lower() not in seen:
            seen.add(name.lower())
            unique.append(name)
    return "".join(out), unique
