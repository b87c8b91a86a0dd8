"""Asana REST plumbing: ``Authorization: Bearer <personal access token>``, bodies and answers wrapped in
``{"data": ...}``, ``limit``/``offset`` pagination with ``next_page: {offset, path, uri}``, and Asana's
errors (``{"errors": [{"message", "help", "phrase"}]}``) mapped to §5.4 categories:

401/403 -> ``provider_auth``; 429 -> ``provider_rate_limited`` with ``Retry-After`` (seconds; 60 when
absent); 404 -> ``provider_status`` 404; a 400 about the pagination ``offset`` (expired or foreign) ->
``cursor_invalid``; other non-2xx -> ``provider_status``; transport -> ``provider_request``; a body that is
not JSON or has no ``data`` -> ``provider_payload``."""
from __future__ import annotations

from typing import Any, Mapping

import httpx

from ..base import ErrorCategory, ProviderError
from ..http import HttpClientMixin, maybe_json, retry_after, status_error

USER_AGENT = "paperclip-connector-asana/1.0"
PAGE_SIZE = 50  # Asana allows 1..100


class AsanaHttp(HttpClientMixin):
    base_url: str

    def _client_headers(self) -> dict:
        headers = {"Accept": "application/json", "Content-Type": "application/json", "User-Agent": USER_AGENT}
        if self.config.credentials:
            headers["Authorization"] = f"Bearer {self.config.credentials}"
        return headers

    def call(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
             data: Mapping[str, Any] | None = None) -> dict:
        """One request; returns the whole JSON object (``data`` and, for listings, ``next_page``)."""
        what = f"Asana {method} {path}"
        kwargs: dict[str, Any] = {"params": {k: v for k, v in (params or {}).items() if v is not None}}
        if data is not None:
            kwargs["json"] = {"data": dict(data)}
        response = self._send(method, self.base_url + path, what, **kwargs)
        if not response.is_success:
            raise self._error(what, response)
        try:
            payload = response.json()
        except ValueError as exc:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"{what}: the answer is not JSON.") from exc
        if not isinstance(payload, Mapping) or "data" not in payload:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"{what}: the answer has no data object.")
        return dict(payload)

    def data(self, method: str, path: str, **kwargs) -> Any:
        return self.call(method, path, **kwargs)["data"]

    @staticmethod
    def _error(what: str, response: httpx.Response) -> ProviderError:
        status = response.status_code
        body = maybe_json(response)
        errors = body.get("errors") if isinstance(body, Mapping) else None
        messages = [str(e.get("message") or "") for e in errors or () if isinstance(e, Mapping)]
        what = f"{what} -> {status}" + (": " + "; ".join(m for m in messages if m) if any(messages) else "")
        if status == 429:
            return status_error(what, status, rate_limited=True, retry_after=retry_after(response.headers))
        if status == 400 and any("offset" in m.lower() or "pagination" in m.lower() for m in messages):
            return ProviderError(ErrorCategory.CURSOR_INVALID, what, status=status)
        return status_error(what, status)

    @staticmethod
    def next_offset(payload: Mapping[str, Any]) -> str | None:
        page = payload.get("next_page")
        if page is None:
            return None
        if not isinstance(page, Mapping) or not isinstance(page.get("offset"), str) or not page["offset"]:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Asana next_page has no offset.")
        return page["offset"]

    def rows(self, payload: Mapping[str, Any], what: str) -> list:
        rows = payload.get("data")
        if not isinstance(rows, list):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Asana {what} listing is not a list.")
        return rows
