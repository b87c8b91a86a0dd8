"""`@Name` / `@url-key` mentions of agents in a comment's Markdown body.

A mention is an ``@`` that starts a word (so ``a@b.com`` is an address, not a mention) in prose:
inline code spans, fenced and indented code blocks and raw HTML are never read. After the ``@``
the longest agent name or URL key that ends on a word boundary wins, so ``@Ada Lovelace`` names
"Ada Lovelace" even when an agent "Ada" exists, and ``@Ada,`` or ``@Ada.`` still names "Ada".
Matching is case-insensitive. Agents have no stored URL key: it is derived from the name with
Django's ``slugify`` ("Ada Lovelace" -> ``ada-lovelace``).
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from django.utils.text import slugify
from markdown_it import MarkdownIt

_MD = MarkdownIt("commonmark")
_SKIPPED_BLOCKS = {"fence", "code_block", "html_block"}
_OPAQUE_INLINE = {"code_inline", "html_inline", "image"}  # break prose; their text is never read
_BREAKS = {"softbreak", "hardbreak"}
# An '@' preceded by one of these is part of a word, an address or a path, not a mention.
_MENTION_START = re.compile(r"(?<![\w.+\-/@`])@")
# What a name may run into: a word character or '-', or '.'/'@' that continues a word (a@b.co).
_CONTINUES = re.compile(r"[\w-]|[.@]\w")
_TAIL = 120  # agent names are at most 120 characters


def url_key(name: str) -> str:
    return slugify(name)


def _prose(body: str) -> Iterable[str]:
    """The prose runs of ``body``: text outside code and HTML, one string per inline block."""
    for token in _MD.parse(body):
        if token.type in _SKIPPED_BLOCKS or token.type != "inline":
            continue
        parts = []
        for child in token.children or ():
            if child.type == "text":
                parts.append(child.content)
            elif child.type in _BREAKS:
                parts.append("\n")
            elif child.type in _OPAQUE_INLINE:
                parts.append("\x00")  # a boundary: "@Ada`x`" still names Ada, "`@Ada`" never does
        yield "".join(parts)


def mention_tails(body: str) -> list[str]:
    """The lowercased text after each '@' that can start a mention, in order. Empty (and no
    Markdown parsed) when the body has no '@' at all."""
    if "@" not in body:
        return []
    tails = []
    for run in _prose(body):
        for match in _MENTION_START.finditer(run):
            tails.append(run[match.end():match.end() + _TAIL + 2].casefold())
    return tails


def _names_at(tail: str, label: str) -> bool:
    return tail.startswith(label) and not _CONTINUES.match(tail, len(label))


def mentioned(tails: list[str], agents: Iterable) -> list:
    """The agents (objects with ``name``) the tails name, each once, in order of first mention."""
    labels = []  # (label, agent), longest first so "ada lovelace" beats "ada"
    for agent in agents:
        for label in {agent.name.casefold(), url_key(agent.name)}:
            if label:
                labels.append((label, agent))
    labels.sort(key=lambda pair: len(pair[0]), reverse=True)
    found = {}
    for tail in tails:
        for label, agent in labels:
            if _names_at(tail, label):
                found.setdefault(agent.pk, agent)
                break
    return list(found.values())
