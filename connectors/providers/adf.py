"""Atlassian Document Format (ADF) <-> Markdown, best effort (External Task Protocol §5.3).

Jira Cloud REST v3 carries descriptions and comment bodies as ADF documents
(``{"type": "doc", "version": 1, "content": [...]}``). The host works in Markdown, so:

* :func:`adf_to_markdown` renders paragraphs, headings 1-6, bullet/ordered lists (nested), task lists,
  code blocks (with language), block quotes, rules, hard breaks, tables (GitHub pipe tables), panels
  (as block quotes), expands (title in bold, then the body), and the marks strong, em, strike, code,
  link, underline (dropped), sub/sup (dropped), textColor (dropped). Inline ``mention`` nodes become the
  plain display name (never ``@name``: §5.3 forbids leaking provider mention syntax), ``emoji`` its text
  or ``:shortName:``, ``inlineCard``/``blockCard`` the URL, ``status`` ``[TEXT]``, ``date`` the ISO day.
  Media and anything unknown are replaced by a placeholder. :func:`adf_to_markdown_ex` also returns
  the list of node/mark types that did not convert losslessly (callers record it in the envelope).
* :func:`markdown_to_adf` parses CommonMark (+ tables and strikethrough) with markdown-it-py and builds
  the ADF equivalent. HTML is not representable in ADF: HTML comments (the host's hidden
  ``<!-- paperclip:... -->`` markers) are removed and returned by :func:`split_markers` so the Jira
  adapter can keep them in a comment property; other raw HTML is kept as literal text.
"""
from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

from markdown_it import MarkdownIt

_HTML_COMMENT_RE = re.compile(r"<!--\s*(.*?)\s*-->", re.S)
_MD_ESCAPE_RE = re.compile(r"([\\`*_\[\]#|<>])")


# ------------------------------------------------------------------------------------ ADF -> MD
class _Renderer:
    def __init__(self):
        self.lossy: list[str] = []

    def loss(self, what: str) -> None:
        if what not in self.lossy:
            self.lossy.append(what)

    # blocks -> list of lines
    def blocks(self, nodes, indent: str = "") -> list[str]:
        out: list[str] = []
        for node in nodes or ():
            lines = self.block(node)
            if lines is None:
                continue
            if out:
                out.append("")
            out.extend(lines)
        return out

    def block(self, node) -> list[str] | None:
        if not isinstance(node, dict):
            return None
        kind = node.get("type")
        content = node.get("content") or []
        attrs = node.get("attrs") or {}
        if kind == "paragraph":
            text = self.inline(content)
            return text.split("\n") if text else None
        if kind == "heading":
            level = min(6, max(1, int(attrs.get("level") or 1)))
            return ["#" * level + " " + self.inline(content).replace("\n", " ")]
        if kind in ("bulletList", "orderedList", "taskList"):
            return self.list_block(node)
        if kind == "codeBlock":
            code = "".join(c.get("text", "") for c in content if isinstance(c, dict))
            fence = "````" if "```" in code else "```"
            return [fence + (attrs.get("language") or "")] + code.split("\n") + [fence]
        if kind in ("blockquote", "panel"):
            if kind == "panel":
                self.loss("panel")
            inner = self.blocks(content)
            return ["> " + line if line else ">" for line in inner]
        if kind == "rule":
            return ["---"]
        if kind in ("expand", "nestedExpand"):
            self.loss(kind)
            title = attrs.get("title")
            inner = self.blocks(content)
            return ([f"**{title}**", ""] if title else []) + inner
        if kind == "table":
            return self.table(node)
        if kind in ("mediaSingle", "mediaGroup", "media"):
            self.loss("media")
            return ["[attachment]"]
        if kind == "blockCard" or kind == "embedCard":
            return [str(attrs.get("url") or "")]
        if kind in ("text", "mention", "emoji", "hardBreak", "inlineCard", "status", "date"):
            return [self.inline([node])]
        self.loss(str(kind))
        inner = self.blocks(content)
        return inner or None

    def list_block(self, node) -> list[str]:
        kind = node.get("type")
        start = int((node.get("attrs") or {}).get("order") or 1)
        out: list[str] = []
        for i, item in enumerate(node.get("content") or []):
            if not isinstance(item, dict):
                continue
            if kind == "orderedList":
                marker = f"{start + i}. "
            elif kind == "taskList":
                done = (item.get("attrs") or {}).get("state") == "DONE"
                marker = "- [x] " if done else "- [ ] "
            else:
                marker = "- "
            pad = " " * len(marker)
            if item.get("type") == "taskItem":  # inline content directly
                body = self.inline(item.get("content") or []).split("\n")
            else:
                body = self.blocks(item.get("content") or [])
                # tight list: drop blank lines between a paragraph and a nested list
                body = [line for j, line in enumerate(body) if line or not self._next_is_list(body, j)]
            if not body:
                body = [""]
            out.append(marker + body[0])
            out.extend((pad + line) if line else "" for line in body[1:])
        return out

    @staticmethod
    def _next_is_list(lines, j) -> bool:
        nxt = lines[j + 1] if j + 1 < len(lines) else ""
        return bool(re.match(r"^(- |\d+\. )", nxt))

    def table(self, node) -> list[str]:
        rows = []
        for row in node.get("content") or []:
            cells = []
            for cell in (row or {}).get("content") or []:
                text = " ".join(self.blocks((cell or {}).get("content") or [])).replace("|", "\\|")
                cells.append(text.strip())
            rows.append(cells)
        if not rows:
            return []
        width = max(len(r) for r in rows)
        rows = [r + [""] * (width - len(r)) for r in rows]
        out = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * width]
        out += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return out

    def inline(self, nodes) -> str:
        parts: list[str] = []
        for node in nodes or ():
            if not isinstance(node, dict):
                continue
            kind = node.get("type")
            attrs = node.get("attrs") or {}
            if kind == "text":
                parts.append(self.marked(node.get("text") or "", node.get("marks") or []))
            elif kind == "hardBreak":
                parts.append("\n")
            elif kind == "mention":
                name = str(attrs.get("text") or attrs.get("displayName") or "someone").lstrip("@")
                parts.append(name)
            elif kind == "emoji":
                parts.append(str(attrs.get("text") or f":{str(attrs.get('shortName') or '').strip(':')}:"))
            elif kind == "inlineCard":
                url = attrs.get("url") or ""
                parts.append(f"<{url}>" if url else "")
            elif kind == "status":
                self.loss("status")
                parts.append(f"[{attrs.get('text') or ''}]")
            elif kind == "date":
                try:
                    ts = int(attrs.get("timestamp")) / 1000
                    parts.append(datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d"))
                except (TypeError, ValueError):
                    parts.append(str(attrs.get("timestamp") or ""))
            else:
                self.loss(str(kind))
                parts.append(self.inline(node.get("content") or []))
        return "".join(parts)

    def marked(self, text: str, marks) -> str:
        names = {m.get("type"): m for m in marks if isinstance(m, dict)}
        if "code" in names:
            ticks = "``" if "`" in text else "`"
            out = f"{ticks}{text}{ticks}" if ticks == "`" else f"`` {text} ``"
        else:
            out = text
            if "strong" in names:
                out = f"**{out}**"
            if "em" in names:
                out = f"*{out}*"
            if "strike" in names:
                out = f"~~{out}~~"
        for dropped in ("underline", "subsup", "textColor", "backgroundColor", "annotation"):
            if dropped in names:
                self.loss(dropped)
        if "link" in names:
            href = (names["link"].get("attrs") or {}).get("href") or ""
            out = f"[{out}]({href})"
        return out


def adf_to_markdown_ex(doc: Any) -> tuple[str, list[str]]:
    """ADF document (or a plain string, returned as-is) -> (Markdown, lossy node/mark types)."""
    if doc is None:
        return "", []
    if isinstance(doc, str):
        return doc, []
    renderer = _Renderer()
    if not isinstance(doc, dict):
        return "", ["invalid"]
    lines = renderer.blocks(doc.get("content") or [] if doc.get("type") == "doc" else [doc])
    return "\n".join(lines).strip("\n"), renderer.lossy


def adf_to_markdown(doc: Any) -> str:
    return adf_to_markdown_ex(doc)[0]


# ------------------------------------------------------------------------------------ MD -> ADF
_md = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])


def split_markers(markdown: str) -> tuple[str, list[str]]:
    """Remove HTML comments (``<!-- paperclip:backlink -->``) -> (text without them, their contents)."""
    markers = [m.group(1) for m in _HTML_COMMENT_RE.finditer(markdown or "")]
    text = _HTML_COMMENT_RE.sub("", markdown or "")
    text = re.sub(r"\n{3,}", "\n\n", text).strip("\n")
    return text, markers


def _text(value: str, marks: list[dict]) -> dict:
    node: dict = {"type": "text", "text": value}
    if marks:
        node["marks"] = [dict(m) for m in marks]
    return node


def _inline_children(children) -> list[dict]:
    out: list[dict] = []
    marks: list[dict] = []

    def push(mark):
        marks.append(mark)

    def pop(kind):
        for i in range(len(marks) - 1, -1, -1):
            if marks[i]["type"] == kind:
                del marks[i]
                return

    for tok in children or ():
        t = tok.type
        if t == "text":
            if tok.content:
                out.append(_text(tok.content, marks))
        elif t == "code_inline":
            out.append(_text(tok.content, [m for m in marks if m["type"] == "link"] + [{"type": "code"}]))
        elif t in ("softbreak",):
            out.append(_text(" ", marks)) if out else None
        elif t == "hardbreak":
            out.append({"type": "hardBreak"})
        elif t == "strong_open":
            push({"type": "strong"})
        elif t == "strong_close":
            pop("strong")
        elif t == "em_open":
            push({"type": "em"})
        elif t == "em_close":
            pop("em")
        elif t == "s_open":
            push({"type": "strike"})
        elif t == "s_close":
            pop("strike")
        elif t == "link_open":
            push({"type": "link", "attrs": {"href": tok.attrGet("href") or ""}})
        elif t == "link_close":
            pop("link")
        elif t == "image":
            src = tok.attrGet("src") or ""
            alt = tok.content or src
            out.append(_text(alt, marks + [{"type": "link", "attrs": {"href": src}}]))
        elif t == "html_inline":
            if not _HTML_COMMENT_RE.fullmatch(tok.content.strip()):
                out.append(_text(tok.content, marks))
        else:
            if tok.content:
                out.append(_text(tok.content, marks))
    # merge adjacent text nodes with identical marks
    merged: list[dict] = []
    for node in out:
        if merged and node["type"] == "text" and merged[-1]["type"] == "text" and \
                merged[-1].get("marks") == node.get("marks"):
            merged[-1]["text"] += node["text"]
        else:
            merged.append(node)
    return merged


def markdown_to_adf(markdown: str | None) -> dict:
    """Markdown -> ADF document (HTML comments dropped: use :func:`split_markers` to keep them)."""
    tokens = _md.parse(markdown or "")
    root = {"type": "doc", "version": 1, "content": []}
    stack: list[dict] = [root]

    def append(node):
        stack[-1].setdefault("content", []).append(node)

    def open_(node):
        append(node)
        stack.append(node)

    for tok in tokens:
        t = tok.type
        if t == "paragraph_open":
            open_({"type": "paragraph", "content": []})
        elif t == "heading_open":
            open_({"type": "heading", "attrs": {"level": int(tok.tag[1])}, "content": []})
        elif t == "bullet_list_open":
            open_({"type": "bulletList", "content": []})
        elif t == "ordered_list_open":
            start = tok.attrGet("start")
            node = {"type": "orderedList", "content": []}
            if start and int(start) != 1:
                node["attrs"] = {"order": int(start)}
            open_(node)
        elif t == "list_item_open":
            open_({"type": "listItem", "content": []})
        elif t == "blockquote_open":
            open_({"type": "blockquote", "content": []})
        elif t == "table_open":
            open_({"type": "table", "content": []})
        elif t == "tr_open":
            open_({"type": "tableRow", "content": []})
        elif t in ("th_open", "td_open"):
            open_({"type": "tableHeader" if t == "th_open" else "tableCell", "content": []})
            open_({"type": "paragraph", "content": []})
        elif t in ("th_close", "td_close"):
            stack.pop()
            stack.pop()
        elif t in ("thead_open", "tbody_open", "thead_close", "tbody_close"):
            continue
        elif t.endswith("_close"):
            if len(stack) > 1:
                stack.pop()
        elif t == "inline":
            stack[-1].setdefault("content", []).extend(_inline_children(tok.children))
        elif t in ("fence", "code_block"):
            info = (tok.info or "").strip().split(" ")[0] if t == "fence" else ""
            node: dict = {"type": "codeBlock", "content": []}
            if info:
                node["attrs"] = {"language": info}
            code = tok.content[:-1] if tok.content.endswith("\n") else tok.content
            if code:
                node["content"] = [{"type": "text", "text": code}]
            append(node)
        elif t == "hr":
            append({"type": "rule"})
        elif t == "html_block":
            rest = _HTML_COMMENT_RE.sub("", tok.content).strip()
            if rest:
                append({"type": "paragraph", "content": [{"type": "text", "text": rest}]})
    _prune(root)
    return root


def _prune(node: dict) -> None:
    """ADF rejects empty text nodes; a list item needs at least one paragraph."""
    content = node.get("content")
    if not isinstance(content, list):
        return
    for child in content:
        if isinstance(child, dict):
            _prune(child)
    node["content"] = [c for c in content if not (c.get("type") == "text" and not c.get("text"))]
    if node.get("type") == "listItem" and not node["content"]:
        node["content"] = [{"type": "paragraph", "content": []}]


def plain_text(doc: Any) -> str:
    """All text of an ADF document, no formatting (search, previews)."""
    if isinstance(doc, str):
        return doc
    out: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            if node.get("type") == "text":
                out.append(node.get("text") or "")
            elif node.get("type") == "mention":
                out.append(str((node.get("attrs") or {}).get("text") or "").lstrip("@"))
            for child in node.get("content") or []:
                walk(child)
            if node.get("type") in ("paragraph", "heading", "codeBlock", "listItem"):
                out.append("\n")

    walk(doc)
    return "".join(out).strip()
