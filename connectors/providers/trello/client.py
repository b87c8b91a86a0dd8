"""Trello REST (``<base_url>/1/...``): authentication, errors (§5.4) and rate limits.

``credentials`` is ``"<api key>:<token>"``; it is sent as ``Authorization: OAuth oauth_consumer_key="<key>",
oauth_token="<token>"`` (Trello accepts this header in place of the ``key``/``token`` query parameters,
which would end up in access logs). Trello answers most errors as plain text ("invalid id", "invalid
token"); a rate limit is a 429 with a JSON body (``{"error": "API_TOKEN_LIMIT_EXCEEDED" | "API_KEY_LIMIT_EXCEEDED",
"message": ...}``) and *no* ``Retry-After``: the limits are windows of 10 s (300 requests per key, 100 per
token), so the adapter waits one window (:data:`RATE_WINDOW_SECONDS`) unless a ``Retry-After`` says otherwise."""
from __future__ import annotations

from typing import Any

import httpx

from ..base import ErrorCategory, ProviderError
from ..http import HttpClientMixin, header_retry_after, json_body, maybe_json, status_error

USER_AGENT = "paperclip-connector-trello/1.0"
API = "/1"
RATE_WINDOW_SECONDS = 10.0


def split_credentials(value: str | None) -> tuple[str, str]:
    key, sep, token = (value or "").partition(":")
    if not sep or not key.strip() or not token.strip():
        raise ProviderError(ErrorCategory.CONFIG, "Trello credentials must resolve to '<api key>:<token>'.")
    return key.strip(), token.strip()


def error_text(response: httpx.Response) -> str:
    payload = maybe_json(response)
    if isinstance(payload, dict):
        return str(payload.get("message") or payload.get("error") or payload)[:300]
    return (response.text or response.reason_phrase or "")[:300].strip()


class TrelloClient(HttpClientMixin):
    base_url: str

    def _client_headers(self) -> dict:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if self.config.credentials:
            key, token = split_credentials(self.config.credentials)
            headers["Authorization"] = f'OAuth oauth_consumer_key="{key}", oauth_token="{token}"'
        return headers

    def request(self, method: str, path: str, *, params: dict | None = None, body: dict | None = None,
                what: str | None = None) -> Any:
        """One API call -> its JSON (None for an empty body); failures raise ProviderError (§5.4)."""
        what = what or f"Trello {method} {path}"
        if not self.config.credentials:
            raise ProviderError(ErrorCategory.PROVIDER_AUTH, f"{what}: no Trello credentials are configured.")
        response = self._send(method, self.base_url + API + path, what, params=params, json=body)
        if response.is_success:
            return json_body(response, f"{what} returned non-JSON.")
        status = response.status_code
        text = error_text(response)
        message = f"{what} -> {status}: {text}"
        if status == 429:
            wait = header_retry_after(response.headers)
            raise status_error(message, status, rate_limited=True,
                               retry_after=RATE_WINDOW_SECONDS if wait is None else wait)
        # Trello says 401 for a bad key/token and for a token that may not see the object.
        raise status_error(message, status)
