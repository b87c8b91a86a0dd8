"""The API's JSON request parser: DRF's, hardened against hostile bodies.

* **Depth**: a body nested deeper than ``PAPERCLIP["JSON_MAX_DEPTH"]`` is refused before
  ``json.loads`` runs (Python's decoder recurses and would raise RecursionError, a 500, around
  depth 1000; bodies well under that still cost every later recursive walk).
* **Non-finite numbers**: ``NaN``/``Infinity`` literals and numbers that overflow a double
  (``1e999`` parses as infinity) are refused: PostgreSQL's jsonb cannot store them and the
  strict JSON renderer cannot send them back.
* **NUL**: a ``\\u0000`` anywhere in a string or a key is refused naming the top-level field:
  PostgreSQL's text and jsonb types cannot hold it (SQLite would, so both databases answer alike).

Depth and number problems are ``malformed_json`` (a ParseError); a NUL is a ``validation_error``
on the field. :func:`json_depth_exceeds` is shared with the connector webhook intake.
"""
from __future__ import annotations

import codecs
import json
import math
import re
from itertools import accumulate

from django.conf import settings
from rest_framework import parsers, serializers
from rest_framework.exceptions import ParseError

DEFAULT_MAX_DEPTH = 64
NUL_MESSAGE = "Contains a NUL character (\\u0000), which cannot be stored."

# Outside strings valid JSON is ASCII: keep only brackets and quotes, then make both kinds of bracket one.
_KEPT = b'[]{}"'
_DROPPED = bytes(c for c in range(256) if c not in _KEPT)
_ONE_KIND = bytes.maketrans(b"{}", b"[]")
_RUNS = re.compile(rb"\[+|\]+")
_PEEL_PASSES = 4


def max_depth() -> int:
    return int(settings.PAPERCLIP.get("JSON_MAX_DEPTH", DEFAULT_MAX_DEPTH))


def json_depth_exceeds(text: str | bytes, limit: int) -> bool:
    """True when ``text`` nests arrays/objects more than ``limit`` deep (brackets inside strings
    do not count). Linear and in C, cheap before every parse (on a 12 KB webhook body, a fraction of
    parsing it): escaped backslashes, then escaped quotes, are dropped, so the quotes left alternate in
    and out of strings; all but brackets and quotes is dropped; adjacent quotes go (an empty string, or
    the end of one and the start of the next: nothing between them is outside a string), then what
    is between the remaining pairs. The shallow part is peeled off (innermost ``[]`` pairs, a few
    ``bytes.replace`` passes) and the depth of what is left is summed over runs of equal brackets.
    Exact for valid JSON; text that is not JSON may get either answer, and the parser that runs next
    refuses it anyway."""
    data = text.encode("utf-8", errors="replace") if isinstance(text, str) else bytes(text)
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = data.translate(None, _DROPPED)
    if brackets.count(b"[") + brackets.count(b"{") <= limit:
        return False  # cannot nest deeper than it has openers
    brackets = brackets.replace(b'""', b"")
    if b'"' in brackets:
        brackets = b"".join(brackets.split(b'"')[::2])
    brackets = brackets.translate(_ONE_KIND)
    peeled = 0  # each pass removes one level from the bottom of every branch
    while peeled < min(_PEEL_PASSES, limit) and brackets:
        shorter = brackets.replace(b"[]", b"")
        if shorter == brackets:
            break
        brackets, peeled = shorter, peeled + 1
    if not brackets:
        return False
    depth = max(accumulate(len(run) if run[:1] == b"[" else -len(run) for run in _RUNS.findall(brackets)),
                default=0)
    return peeled + depth > limit


def _refuse_constant(name):
    raise ValueError(f"{name} is not a finite number; JSON numbers must be finite.")


def _finite_float(text):
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"Number {text[:40]} is not finite (it overflows a double); JSON numbers must be finite.")
    return value


def loads(text: str):
    """``json.loads`` refusing non-finite numbers (ValueError)."""
    return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)


def has_nul(value) -> bool:
    """Depth-first without recursion (the depth is already bounded, but stay iterative)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            for key, child in item.items():
                if "\x00" in key:
                    return True
                stack.append(child)
        elif isinstance(item, list):
            stack.extend(item)
    return False


def without_nul(value, replacement: str = "\ufffd"):
    """A copy of parsed JSON with every NUL in strings and keys replaced (for untrusted text that
    must be kept, such as a tracker's payload; request bodies are refused instead)."""
    if isinstance(value, str):
        return value.replace("\x00", replacement)
    if isinstance(value, dict):
        return {without_nul(k, replacement): without_nul(v, replacement) for k, v in value.items()}
    if isinstance(value, list):
        return [without_nul(v, replacement) for v in value]
    return value


def nul_errors(data) -> dict:
    """``{field: [message]}`` for each top-level member holding a NUL (``non_field_errors`` for a
    NUL in a top-level key or in a body that is not an object)."""
    if isinstance(data, dict):
        errors = {}
        for key, value in data.items():
            if "\x00" in key:
                errors.setdefault("non_field_errors", ["A field name contains a NUL character (\\u0000), "
                                                           "which cannot be stored."])
            elif has_nul(value):
                errors[key] = [NUL_MESSAGE]
        return errors
    return {"non_field_errors": [NUL_MESSAGE]} if has_nul(data) else {}


class JSONParser(parsers.JSONParser):
    """DRF's JSONParser with the checks above (set as DEFAULT_PARSER_CLASSES)."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = parsers.get_encoding(parser_context or {})
        try:
            text = codecs.decode(stream.read(), encoding)
        except UnicodeDecodeError as exc:
            raise ParseError(f"JSON parse error - the body is not valid {encoding}: {exc.reason}.") from None
        limit = max_depth()
        if json_depth_exceeds(text, limit):
            raise ParseError(f"JSON parse error - nested too deep (more than {limit} levels of arrays/objects).")
        try:
            data = loads(text)
        except RecursionError:  # a limit configured above what the decoder can recurse
            raise ParseError("JSON parse error - nested too deep.") from None
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        # The escape is the only way a NUL gets into a JSON string: skip the walk without it.
        if "\\u0000" in text:
            errors = nul_errors(data)
            if errors:
                raise serializers.ValidationError(errors)
        return data
