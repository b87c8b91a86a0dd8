"""Markdown to safe HTML: markdown-it-py renders (CommonMark + tables + strikethrough), nh3 sanitizes.

Everything rendered here may come from an agent, a tracker or a user, so the output is never trusted
before nh3 has removed scripts, event handlers, ``javascript:`` URLs and unknown tags. Raw HTML in the
source is parsed (so that a ``<script>`` element is dropped with its content instead of being shown as
text) and then filtered like everything else.
"""
from __future__ import annotations

from functools import lru_cache

import nh3
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt

ALLOWED_TAGS = {
    "a", "abbr", "b", "blockquote", "br", "code", "del", "details", "em", "h1", "h2", "h3", "h4", "h5", "h6",
    "hr", "i", "img", "kbd", "li", "ol", "p", "pre", "s", "span", "strong", "sub", "summary", "sup", "table",
    "tbody", "td", "th", "thead", "tr", "ul",
}
ALLOWED_ATTRIBUTES = {
    "a": {"href", "title"},
    "img": {"src", "alt", "title"},
    "code": {"class"},
    "th": {"align"},
    "td": {"align"},
    "ol": {"start"},
}
URL_SCHEMES = {"http", "https", "mailto"}


@lru_cache(maxsize=1)
def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark", {"html": True, "linkify": False}).enable(["table", "strikethrough"])


def render_markdown(text: str | None) -> SafeString:
    """Sanitized HTML for ``text`` (empty string for empty input)."""
    if not text:
        return mark_safe("")
    html = _parser().render(text)
    cleaned = nh3.clean(
        html,
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        url_schemes=URL_SCHEMES,
        link_rel="noopener noreferrer nofollow",
        strip_comments=True,
    )
    return mark_safe(cleaned)  # noqa: S308 - sanitized by nh3 just above
