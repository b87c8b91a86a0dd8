"""Template helpers of the operator console: ``{% load console %}``."""
import json

from django import template

from paperclip.core.links import web_url
from paperclip.core.markdown import render_markdown

register = template.Library()


@register.filter(name="markdown")
def markdown_filter(text):
    """Sanitized HTML from Markdown (markdown-it-py, then nh3)."""
    return render_markdown(text)


@register.filter
def web_link(url):
    """The URL when it may be an ``href`` (absolute http(s)), else ``""``: every link whose value came
    from outside (a tracker, a runner, an agent) goes through it, so a stored ``javascript:`` URL
    renders as no link. Use: ``{% with href=x.url|web_link %}{% if href %}<a href="{{ href }}">``."""
    return web_url(url)


@register.filter
def pretty_json(value):
    """Indented JSON for a ``<pre>`` block (autoescaped by the template)."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


@register.filter
def cents(value):
    """``1234`` → ``$12.34``."""
    try:
        return f"${int(value) / 100:,.2f}"
    except (TypeError, ValueError):
        return ""


@register.filter
def percent_of(part, whole):
    """Integer percentage of ``part`` in ``whole`` (0 when there is no whole), capped at 100."""
    try:
        part, whole = int(part), int(whole)
    except (TypeError, ValueError):
        return 0
    return min(100, round(part * 100 / whole)) if whole > 0 else 0


@register.filter
def is_scalar(value):
    return value is None or isinstance(value, (str, int, float, bool))
