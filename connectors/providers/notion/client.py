"""Notion's REST API as the adapter uses it: ``Authorization: Bearer <integration token>``, one pinned
``Notion-Version`` (``2022-06-28``: databases are queried with ``POST /v1/databases/{id}/query``),
``start_cursor`` / ``next_cursor`` / ``has_more`` pagination with ``page_size`` <= 100, and Notion's error
body ``{"object": "error", "status", "code", "message"}`` mapped to §5.4 categories:

401 ``unauthorized`` / 403 ``restricted_resource`` -> ``provider_auth``; 429 ``rate_limited`` ->
``provider_rate_limited`` with ``Retry-After`` (seconds; Notion allows ~3 requests/s on average); 404
``object_not_found`` -> ``provider_status`` 404; a 400 ``validation_error`` about ``start_cursor`` ->
``cursor_invalid``; other non-2xx -> ``provider_status``; transport -> ``provider_request``; a body that is
not a JSON object -> ``provider_payload``."""
from __future__ import annotations

from typing import Any, Iterator, Mapping

import httpx

from ..base import ErrorCategory, ProviderError
from ..http import HttpClientMixin, header_retry_after, json_body, maybe_json, status_error

NOTION_VERSION = "2022-06-28"
USER_AGENT = "paperclip-connector-notion/1.0"
MAX_PAGE_SIZE = 100
DEFAULT_RETRY_AFTER = 1.0  # Notion's limit is per second: a 429 without Retry-After waits a second


class NotionClient(HttpClientMixin):
    base_url: str

    def _client_headers(self) -> dict:
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT, "Notion-Version": NOTION_VERSION}
        if self.config.credentials:
            headers["Authorization"] = f"Bearer {self.config.credentials}"
        return headers

    def api(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
            body: Mapping[str, Any] | None = None, what: str | None = None) -> dict:
        """One request to ``<base_url>/v1<path>``; the JSON object Notion answered, or ProviderError."""
        what = what or f"Notion {method} {path}"
        kwargs: dict[str, Any] = {}
        if params:
            kwargs["params"] = {k: v for k, v in params.items() if v is not None}
        if body is not None:
            kwargs["json"] = dict(body)
        response = self._send(method, f"{self.base_url}/v1{path}", what, **kwargs)
        if not response.is_success:
            raise self._error(response, what)
        data = json_body(response, f"{what} returned a body that is not JSON.")
        if not isinstance(data, Mapping):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"{what} returned no JSON object.")
        return dict(data)

    @staticmethod
    def _error(response: httpx.Response, what: str) -> ProviderError:
        status = response.status_code
        payload = maybe_json(response)
        payload = payload if isinstance(payload, Mapping) else {}
        code, message = str(payload.get("code") or ""), str(payload.get("message") or "")
        text = f"{what} -> {status}" + (f" {code}: {message}" if code or message else "")
        if status == 429 or code == "rate_limited":
            wait = header_retry_after(response.headers)
            return status_error(text, status, rate_limited=True,
                                retry_after=DEFAULT_RETRY_AFTER if wait is None else wait)
        if status == 400 and code == "validation_error" and "start_cursor" in message:
            return ProviderError(ErrorCategory.CURSOR_INVALID, text, status=status)
        return status_error(text, status, auth=status in (401, 403) or code in ("unauthorized", "restricted_resource"))

    @staticmethod
    def results(data: Mapping[str, Any], what: str) -> tuple[list, str | None]:
        """A list response -> (results, next cursor or None). ``has_more`` without ``next_cursor`` is malformed."""
        rows = data.get("results")
        if not isinstance(rows, list):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"{what}: the list response has no results array.")
        more, nxt = bool(data.get("has_more")), data.get("next_cursor")
        if more and not isinstance(nxt, str):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"{what}: has_more without a next_cursor.")
        return [r for r in rows if isinstance(r, Mapping)], (nxt if more else None)

    def walk(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
             body: Mapping[str, Any] | None = None, max_pages: int = 50, what: str = "") -> Iterator[dict]:
        """Every result of a paginated list (GET: ``start_cursor`` in the query; POST: in the body)."""
        cursor = None
        for _ in range(max_pages):
            if method == "GET":
                data = self.api(method, path, params={**(params or {}), "page_size": MAX_PAGE_SIZE,
                                                      "start_cursor": cursor}, what=what or None)
            else:
                data = self.api(method, path, body={**(body or {}), "page_size": MAX_PAGE_SIZE,
                                                    **({"start_cursor": cursor} if cursor else {})}, what=what or None)
            rows, cursor = self.results(data, what or path)
            yield from rows
            if cursor is None:
                return
        raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"{what or path}: more than {max_pages} pages of results.")
