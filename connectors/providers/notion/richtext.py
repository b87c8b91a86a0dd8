"""Notion rich text and blocks <-> Markdown (best effort, §5.3).

Rich text: bold/italic/strikethrough/code annotations and links become Markdown and back; user mentions
become the plain display name (never ``@name``, so nothing pings in Paperclip), other mentions their
plain text. Notion cannot hold an HTML comment, so the engine's hidden ``<!-- paperclip:... -->``
markers are written as a gray italic ``paperclip:...`` segment and restored from exactly that on read
(the marker stays visible in Notion as a small gray tag).

Blocks: paragraphs, headings, list items, to-dos, quotes, callouts, toggles, code and dividers become
Markdown; nested children are not read and other block types are skipped. What was lost is noted in
the envelope (``descriptionLossy``), with the block references (``blocks``) for backlinks (A.4)."""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

TEXT_LIMIT = 2000  # characters per rich text object (Notion's limit)
MARKER_COLOR = "gray"
_MARKER_TEXT = re.compile(r"paperclip:[A-Za-z0-9:=._-]+")
_MARKER_HTML = re.compile(r"<!--\s*(paperclip:[A-Za-z0-9:=._-]+)\s*-->")
# links, bold, inline code, in that order of precedence (a deliberately small Markdown subset)
_INLINE = re.compile(r"\[([^\]\n]+)\]\((https?://[^)\s]+)\)|\*\*([^*\n]+)\*\*|`([^`\n]+)`")
LIST_TYPES = ("bulleted_list_item", "numbered_list_item", "to_do")
PREFIX = {"heading_1": "# ", "heading_2": "## ", "heading_3": "### ", "bulleted_list_item": "- ",
          "numbered_list_item": "1. ", "quote": "> ", "callout": "> ", "toggle": "", "paragraph": ""}


def plain(rich_text: Iterable[Mapping[str, Any]] | None) -> str:
    """The plain text of a rich text array (titles): mentions as their display text without ``@``."""
    out = []
    for seg in rich_text or ():
        if not isinstance(seg, Mapping):
            continue
        text = str(seg.get("plain_text") or (seg.get("text") or {}).get("content") or "")
        if seg.get("type") == "mention" and (seg.get("mention") or {}).get("type") == "user":
            text = text.lstrip("@")
        out.append(text)
    return "".join(out)


def to_markdown(rich_text: Iterable[Mapping[str, Any]] | None) -> tuple[str, list[str]]:
    """Rich text -> (Markdown, names of the users mentioned)."""
    out, mentioned = [], []
    for seg in rich_text or ():
        if not isinstance(seg, Mapping):
            continue
        kind = seg.get("type")
        annotations = seg.get("annotations") if isinstance(seg.get("annotations"), Mapping) else {}
        text = str(seg.get("plain_text") or (seg.get("text") or {}).get("content") or "")
        if kind == "mention":
            mention = seg.get("mention") if isinstance(seg.get("mention"), Mapping) else {}
            if mention.get("type") == "user":
                name = text.lstrip("@") or str((mention.get("user") or {}).get("name") or "someone")
                mentioned.append(name)
                out.append(name)
                continue
            out.append(text)
            continue
        if kind == "equation":
            out.append(f"${(seg.get('equation') or {}).get('expression') or text}$")
            continue
        if annotations.get("color") == MARKER_COLOR and annotations.get("italic") and _MARKER_TEXT.fullmatch(text):
            out.append(f"<!-- {text} -->")
            continue
        link = (((seg.get("text") or {}).get("link") or {}).get("url")) if kind == "text" else None
        if annotations.get("code"):
            text = f"`{text}`"
        if annotations.get("bold"):
            text = f"**{text}**"
        if annotations.get("italic"):
            text = f"*{text}*"
        if annotations.get("strikethrough"):
            text = f"~~{text}~~"
        if link:
            text = f"[{text}]({link})"
        out.append(text)
    return "".join(out), mentioned


def _text(content: str, *, link: str | None = None, **annotations) -> list[dict]:
    """One or more text objects (split at Notion's 2000-character limit)."""
    out = []
    for start in range(0, max(len(content), 1), TEXT_LIMIT):
        piece = content[start:start + TEXT_LIMIT]
        if not piece:
            continue
        seg: dict[str, Any] = {"type": "text", "text": {"content": piece, "link": {"url": link} if link else None}}
        if annotations:
            seg["annotations"] = annotations
        out.append(seg)
    return out


def from_markdown(text: str) -> list[dict]:
    """Markdown (the small subset above plus hidden markers) -> a rich text array."""
    out: list[dict] = []
    pos = 0
    text = text or ""
    for m in _MARKER_HTML.finditer(text):
        out += _inline(text[pos:m.start()])
        out += _text(m.group(1), italic=True, color=MARKER_COLOR)
        pos = m.end()
    out += _inline(text[pos:])
    return out


def _inline(text: str) -> list[dict]:
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out += _text(text[pos:m.start()])
        if m.group(1) is not None:
            out += _text(m.group(1), link=m.group(2))
        elif m.group(3) is not None:
            out += _text(m.group(3), bold=True)
        else:
            out += _text(m.group(4), code=True)
        pos = m.end()
    out += _text(text[pos:])
    return out


def block_markdown(block: Mapping[str, Any]) -> tuple[str | None, list[str]]:
    """One block -> (Markdown or None when the type is not converted, mentioned names)."""
    kind = block.get("type")
    body = block.get(kind) if isinstance(block.get(kind), Mapping) else {}
    if kind == "divider":
        return "---", []
    if kind == "code":
        return f"```{body.get('language') or ''}\n{plain(body.get('rich_text'))}\n```", []
    if kind == "to_do":
        text, names = to_markdown(body.get("rich_text"))
        return f"- [{'x' if body.get('checked') else ' '}] {text}", names
    if kind in PREFIX:
        text, names = to_markdown(body.get("rich_text"))
        return PREFIX[kind] + text, names
    return None, []


def blocks_markdown(blocks: Iterable[Mapping[str, Any]]) -> tuple[str, list[str], list[str]]:
    """Blocks -> (Markdown, mentioned names, notes on what was lost)."""
    parts: list[tuple[str, str]] = []
    mentioned, skipped, nested = [], set(), False
    for block in blocks:
        if not isinstance(block, Mapping):
            continue
        text, names = block_markdown(block)
        mentioned += names
        if text is None:
            skipped.add(str(block.get("type")))
            continue
        nested = nested or bool(block.get("has_children"))
        parts.append((str(block.get("type")), text))
    out = []
    for index, (kind, text) in enumerate(parts):
        if index:
            out.append("\n" if kind in LIST_TYPES and parts[index - 1][0] in LIST_TYPES else "\n\n")
        out.append(text)
    notes = [f"block types not converted: {', '.join(sorted(skipped))}"] if skipped else []
    if nested:
        notes.append("nested block content is not read")
    return "".join(out), mentioned, notes


def markdown_blocks(text: str) -> list[dict]:
    """Markdown -> paragraph/heading/list blocks (one per paragraph or line-item), for page creation."""
    blocks = []
    for chunk in re.split(r"\n\s*\n", (text or "").strip()):
        lines = chunk.split("\n")
        if all(re.match(r"^(- |\* )", line) for line in lines):
            blocks += [_block("bulleted_list_item", line[2:]) for line in lines]
            continue
        m = re.match(r"^(#{1,3}) (.*)$", chunk)
        if m and "\n" not in chunk:
            blocks.append(_block(f"heading_{len(m.group(1))}", m.group(2)))
            continue
        if chunk:
            blocks.append(_block("paragraph", chunk))
    return blocks[:100]


def _block(kind: str, text: str) -> dict:
    return {"object": "block", "type": kind, kind: {"rich_text": from_markdown(text)}}
