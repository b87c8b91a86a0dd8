"""Plumbing the HTTP adapters (GitHub, Jira, Linear) share: their httpx client, transport and status
errors mapped to §5.4 categories, ``Retry-After`` / rate-limit reset parsing, JSON bodies, webhook
signature/body checks and the keyset listing cursor (``since`` + ``seen`` ids at that instant).

Provider-specific rules (which statuses mean a rate limit, what a GraphQL error code means) stay in
the provider modules; these helpers only take the decisions they pass in."""
from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Mapping

import httpx

from paperclip.core.outbound_http import OutboundRefused, guarded_client

from .base import (
    AdapterConfig,
    ErrorCategory,
    ExternalState,
    ProviderError,
    StateCategory,
    WebhookUnparseable,
    normalize_state_name,
)

DEFAULT_RETRY_AFTER = 60.0  # seconds, when a rate-limited response does not say
# Every TaskSourceAdapter operation, the optional writes included: the HTTP adapters implement all.
ALL_OPERATIONS = frozenset({
    "list_candidate_tasks", "get_task", "get_task_states", "list_comments", "verify_webhook",
    "validate_state_mapping", "create_task", "update_task_state", "post_comment", "set_fields",
    "set_backlink", "find_backlinks",
})


# --- timestamps ----------------------------------------------------------------------------------
def parse_utc(value: Any) -> datetime | None:
    """An ISO-8601 string (``Z``, ``+00:00`` or Jira's ``+0530``) -> aware UTC datetime; None if not one."""
    if not value or not isinstance(value, str):
        return None
    text = value.replace("Z", "+00:00")
    m = re.match(r"^(.*[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)([+-]\d{2})(\d{2})$", text)
    if m:
        text = f"{m.group(1)}{m.group(2)}:{m.group(3)}"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)


def parse_due(value: Any) -> datetime | None:
    """A due date (``YYYY-MM-DD`` means 00:00 UTC that day) or a full timestamp."""
    if isinstance(value, str) and len(value) == 10:
        return parse_utc(value + "T00:00:00+00:00")
    return parse_utc(value)


def due_date(value: Any) -> str | None:
    """A projection's due value -> the ``YYYY-MM-DD`` the trackers store."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).strftime("%Y-%m-%d")
    return str(value)[:10]


def iso_ms(value: datetime) -> str:
    value = value.astimezone(timezone.utc)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


# --- client, transport, status ------------------------------------------------------------------
class HttpClientMixin:
    """The adapter's own ``httpx.Client`` (built on first use from :meth:`_client_headers`), or one
    passed in, which the adapter then never closes."""

    config: AdapterConfig

    def _init_client(self, client: httpx.Client | None) -> None:
        self._client = client
        self._owns_client = client is None

    def _client_headers(self) -> dict:
        raise NotImplementedError

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            self._client = guarded_client(headers=self._client_headers(), timeout=self.config.timeout)
        return self._client

    def close(self) -> None:
        if self._client is not None and self._owns_client:
            self._client.close()
            self._client = None

    def since_cursor(self, scope: str, since: datetime) -> str | None:
        """The keyset cursor (GitHub's, Jira's and Linear's share the shape) starting at ``since``."""
        return json.dumps({"v": 1, "scope": scope, "since": since.astimezone(timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%SZ"), "seen": []}, separators=(",", ":"))

    def _send(self, method: str, url: str, what: str, **kwargs) -> httpx.Response:
        """Send; transport failures (connect, timeout, protocol) become ``provider_request``."""
        try:
            return self.client.request(method, url, **kwargs)
        except OutboundRefused as exc:
            raise ProviderError(ErrorCategory.CONFIG, f"{what} refused: {exc}") from exc
        except httpx.HTTPError as exc:
            raise ProviderError(ErrorCategory.PROVIDER_REQUEST, f"{what} failed: {exc}") from exc


def json_body(response: httpx.Response, message: str) -> Any:
    """A 2xx body: None when empty (204), else its JSON; a non-JSON body is ``provider_payload``."""
    if response.status_code == 204 or not response.content:
        return None
    try:
        return response.json()
    except ValueError as exc:
        raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, message) from exc


def maybe_json(response: httpx.Response) -> Any:
    """An error body that may be JSON: parsed, else None."""
    try:
        return response.json() if response.content else None
    except ValueError:
        return None


def _seconds(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _until(reset: str | None) -> float | None:
    """Seconds until a rate-limit reset given as epoch seconds or epoch milliseconds."""
    if not reset:
        return None
    try:
        value = float(reset)
    except ValueError:
        return None
    if value > 1e11:  # epoch milliseconds
        value /= 1000.0
    return max(0.0, value - time.time())


def header_retry_after(headers: Mapping[str, str]) -> float | None:
    """``Retry-After`` in seconds, None when absent or not a number."""
    return _seconds(headers.get("retry-after"))


def retry_after(headers: Mapping[str, str], *reset_headers: str) -> float:
    """``Retry-After``, else the first present reset header minus now, else :data:`DEFAULT_RETRY_AFTER`."""
    wait = header_retry_after(headers)
    if wait is None:
        wait = _until(next((headers[name] for name in reset_headers if headers.get(name)), None))
    return DEFAULT_RETRY_AFTER if wait is None else wait


def status_error(what: str, status: int, *, rate_limited: bool = False, retry_after: float | None = None,
                 auth: bool | None = None) -> ProviderError:
    """The §5.4 error for a failed response: a rate limit wins, then auth (default: 401/403), else
    ``provider_status``. The provider decides what counts as either."""
    if rate_limited:
        return ProviderError(ErrorCategory.PROVIDER_RATE_LIMITED, what, status=status, retry_after=retry_after)
    if auth if auth is not None else status in (401, 403):
        return ProviderError(ErrorCategory.PROVIDER_AUTH, what, status=status)
    return ProviderError(ErrorCategory.PROVIDER_STATUS, what, status=status)


# --- normalization --------------------------------------------------------------------------------
def norm_names(value: Any) -> dict[str, str]:
    """A ``{name: category}`` mapping with both sides trimmed + lowercased; non-string values dropped."""
    if not isinstance(value, Mapping):
        return {}
    return {normalize_state_name(k): normalize_state_name(v) for k, v in value.items() if isinstance(v, str)}


def mapped_state(name: str, category: str | None) -> tuple[ExternalState, str | None]:
    """(state, unmapped name): a name without a known category is ``backlog`` and reported (§7.2)."""
    if category in StateCategory.ALL:
        return ExternalState(name, category), None
    return ExternalState(name, StateCategory.BACKLOG), name


def note_envelope(envelope: dict, mentions: Iterable[str], unmapped: str | None) -> dict:
    """Record neutralized mentions (deduplicated, in order) and an unmapped state name (§7.2)."""
    mentions = list(dict.fromkeys(mentions))
    if mentions:
        envelope["mentionsNeutralized"] = mentions
    if unmapped:
        envelope["unmappedState"] = unmapped
    return envelope


def required_title(projection: Mapping[str, Any]) -> str:
    title = projection.get("title")
    if not isinstance(title, str) or not title.strip():
        raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "create_task needs a non-empty title.")
    return title


def normalize_each(normalize: Callable[[Any], Any], rows: Iterable[Any], what: str,
                   key_of: Callable[[Mapping], Any] = lambda row: None) -> tuple[list, list[dict]]:
    """Normalize the rows one by one (§13.1.8): a malformed one is left out and reported as
    ``{"recordId", "recordKey", "reason"}`` instead of failing the whole page -> (items, skipped)."""
    items, skipped = [], []
    for row in rows:
        try:
            items.append(normalize(row))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            skipped.append(skipped_record(row, f"Malformed {what}: {exc!r}", key_of))
    return items, skipped


def skipped_record(row: Any, reason: str, key_of: Callable[[Mapping], Any] = lambda row: None) -> dict:
    """The report of a listing record that was not normalized (its id and key when it has them)."""
    record_id = row.get("id") if isinstance(row, Mapping) else None
    try:
        key = key_of(row) if isinstance(row, Mapping) else None
    except Exception:  # noqa: BLE001 — the key is a courtesy for the health entry
        key = None
    return {"recordId": None if record_id is None else str(record_id)[:200],
            "recordKey": None if key is None else str(key)[:200], "reason": reason[:500]}


def check_categories(add: Callable[[str, str], None], prefix: str, value: Any, *, shape: str,
                     names: str | None = None, keys: Iterable[str] | None = None, key_reason: str = "") -> None:
    """Validate a ``{<shape>: category}`` object: keys must be non-empty strings (reported as ``names``,
    when given) and among ``keys`` (when given, else ``key_reason``); values known categories."""
    if value is None:
        return
    if not isinstance(value, Mapping):
        add(prefix, f"must be an object {{{shape}: category}}")
        return
    for name, category in value.items():
        if names is not None and (not isinstance(name, str) or not name.strip()):
            add(prefix, f"{names} must be non-empty strings, got {name!r}")
        elif keys is not None and normalize_state_name(name) not in keys:
            add(f"{prefix}.{name}", key_reason)
        elif not isinstance(category, str) or normalize_state_name(category) not in StateCategory.ALL:
            add(f"{prefix}.{name}", f"unknown category {category!r}; expected one of {', '.join(StateCategory.ALL)}")


def check_overrides(add: Callable[[str, str], None], field: str, value: Any, what: str,
                    checks: Mapping[str, Callable[[str, Any], None]]) -> None:
    """Validate per-container mapping overrides ``{<what>: {<sub>: {...}}}``; ``checks`` (in order)
    validates each allowed sub-key as ``check(field path, value)``."""
    subs = list(checks)
    if not isinstance(value, Mapping):
        add(field, f"must be an object {{{what}: {{{', '.join(subs)}}}}}")
        return
    for container, override in value.items():
        if not isinstance(override, Mapping):
            add(f"{field}.{container}", f"must be an object with {' and/or '.join(repr(sub) for sub in subs)}")
            continue
        for sub in override:
            if sub not in checks:
                add(f"{field}.{container}.{sub}", f"unknown key; expected {' or '.join(subs)}")
        for sub, check in checks.items():
            check(f"{field}.{container}.{sub}", override.get(sub))


# --- webhooks ------------------------------------------------------------------------------------
def lower_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    return {str(k).lower(): v for k, v in (headers or {}).items()}


def signature_matches(secret: str, body: bytes, hex_digest: str) -> bool:
    """Constant-time check of a hex HMAC-SHA256 of the raw body."""
    expected = hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, hex_digest.lower())


def webhook_event_id(delivery_id: str | None, body: bytes) -> str:
    """The provider's delivery id, else a content hash (the inbound idempotency key)."""
    return delivery_id or ("sha256:" + hashlib.sha256(body).hexdigest())


def webhook_json(body: bytes, provider: str) -> dict:
    """Parse a verified body; anything but a JSON object is WebhookUnparseable."""
    try:
        payload = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise WebhookUnparseable(f"{provider} webhook body is not JSON.") from None
    if not isinstance(payload, dict):
        raise WebhookUnparseable(f"{provider} webhook body is not a JSON object.")
    return payload


# --- keyset cursors ------------------------------------------------------------------------------
def _cursor_error(message: str) -> ProviderError:
    return ProviderError(ErrorCategory.CURSOR_INVALID, message)


def load_cursor(cursor: str, scope: str, provider: str) -> dict:
    """A cursor's JSON object after the checks every provider makes (version 1, same scope)."""
    try:
        data = json.loads(cursor)
    except (TypeError, ValueError):
        raise _cursor_error(f"{provider} cursor is not JSON.") from None
    if not isinstance(data, dict) or data.get("v") != 1:
        raise _cursor_error(f"{provider} cursor has an unknown shape or version.")
    if str(data.get("scope", "")).lower() != scope.lower():
        raise _cursor_error(f"{provider} cursor is for {data.get('scope')!r}, not {scope!r}.")
    return data


def decode_cursor(cursor: str | None, scope: str, page_key: str, *, provider: str, page_types: tuple,
                  page_error: str) -> dict:
    """A high-water cursor (``since``/``seen``, mid-pass also ``hw``/``hwSeen`` and the page position
    under ``page_key``) -> its state; a blank state for None."""
    if cursor is None:
        return {"since": None, "seen": [], "hw": None, "hwSeen": [], page_key: None}
    data = load_cursor(cursor, scope, provider)
    for key in ("since", "hw"):
        if data.get(key) is not None and parse_utc(data.get(key)) is None:
            raise _cursor_error(f"{provider} cursor {key!r} is not a timestamp.")
    for key in ("seen", "hwSeen"):
        if not isinstance(data.get(key, []), list):
            raise _cursor_error(f"{provider} cursor {key!r} is not a list.")
    page = data.get(page_key)
    if page is not None and not isinstance(page, page_types):
        raise _cursor_error(page_error)
    return {"since": data.get("since"), "seen": [str(s) for s in data.get("seen", [])], "hw": data.get("hw"),
            "hwSeen": [str(s) for s in data.get("hwSeen", [])], page_key: page}


def encode_cursor(scope: str, state: dict, page_key: str) -> str:
    out: dict[str, Any] = {"v": 1, "scope": scope, "since": state["since"], "seen": state["seen"]}
    if state.get(page_key) is not None:
        out.update(hw=state["hw"], hwSeen=state["hwSeen"], **{page_key: state[page_key]})
    return json.dumps(out, separators=(",", ":"))


def scan_rows(rows: Iterable[tuple[str, datetime | None, Any]], since: str | None, seen: Iterable[str],
              hw: str | None, hw_seen: Iterable[str], *, fmt: Callable[[datetime], str] = iso_ms,
              drop_older: bool = False) -> tuple[list, str | None, list[str]]:
    """Walk ``(id, updated, raw)`` rows: skip those already listed at the inclusive ``since`` boundary
    (ids in ``seen``; with ``drop_older`` also rows before it) and raise the high-water mark ``hw``
    with the ids listed exactly at it. Returns (fresh raws, hw, hw_seen)."""
    since_dt, seen = parse_utc(since), set(seen)
    hw_dt, hw_seen = parse_utc(hw), list(hw_seen)
    fresh = []
    for rid, updated, raw in rows:
        if since_dt is not None and updated is not None and (
                (updated == since_dt and rid in seen) or (drop_older and updated < since_dt)):
            continue
        fresh.append(raw)
        if updated is None:
            continue
        if hw_dt is None or updated > hw_dt:
            hw_dt, hw, hw_seen = updated, fmt(updated), [rid]
        elif updated == hw_dt and rid not in hw_seen:
            hw_seen.append(rid)
    return fresh, hw, hw_seen


def advance_cursor(state: dict, rows, next_page, page_key: str, *, drop_older: bool = False):
    """Apply one page to a :func:`decode_cursor` state -> (fresh raws, new state, advanced?). The pass
    keeps ``since`` while ``next_page`` is set; when it ends ``since``/``seen`` move to the high water."""
    fresh, hw, hw_seen = scan_rows(rows, state["since"], state["seen"], state["hw"] or state["since"],
                                   state["hwSeen"] if state["hw"] else state["seen"], drop_older=drop_older)
    if next_page is not None:
        new = {"since": state["since"], "seen": state["seen"], "hw": hw, "hwSeen": hw_seen, page_key: next_page}
    else:
        new = {"since": hw, "seen": hw_seen, "hw": None, "hwSeen": [], page_key: None}
    return fresh, new, bool(fresh) or next_page is not None
