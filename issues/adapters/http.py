"""Wake an agent that lives behind an HTTP endpoint.

adapter_config::

    {"url": "https://agents.example.com/wake", "secret_ref": "env:PAPERCLIP_SECRET_AGENT_WAKE_SECRET", "timeout_seconds": 10}

The host POSTs a JSON wake payload (run, agent, company, issue, wake reason, comment ids, the
API url and a run-scoped API key, plus what a process agent gets in its environment: wake comment,
reasons, approval, linked issues, continuation, retry, the compact ``wakePayload`` and the
``taskPacket`` text) with ``X-Paperclip-Signature: sha256=<hex HMAC-SHA256 of the
raw body>`` keyed by the secret ``secret_ref`` names. Inline secrets are refused. A 2xx answer
means "accepted": ``execute`` returns None and the agent reports through the REST API. Anything
else (non-2xx, timeout, connection error) is a failed result. Redirects are not followed, so the
key is only ever sent to the configured URL; the URL must pass the outbound guard
(paperclip.core.outbound_http: https, public addresses unless allowed).
"""
from __future__ import annotations

import hashlib
import hmac
import json

import httpx
from django.utils import timezone

from issues.choices import AdapterType, RunEventKind, RunStatus
from paperclip.core.outbound_http import OutboundRefused, guarded_client, url_refusal

from .base import (
    Adapter,
    AdapterConfigError,
    AdapterResult,
    RunContext,
    log_event,
    redact,
    resolve_secret_ref,
    secret_ref_check,
    run_stop_state,
)

SIGNATURE_HEADER = "X-Paperclip-Signature"
DEFAULT_TIMEOUT = 10.0


def sign(body: bytes, secret: str) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(body: bytes, header: str, secret: str) -> bool:
    """For receivers (and tests): constant-time check of the signature header over the raw body."""
    return hmac.compare_digest(sign(body, secret), header or "")


def wake_payload(ctx: RunContext) -> dict:
    """The process adapter's context in one signed body: the wake facts under the API's names
    (issues.run_context.WakeFacts.as_dict), the compact wake payload and the task packet text."""
    env = ctx.env
    comment_ids = [c for c in env.get("PAPERCLIP_WAKE_COMMENT_IDS", "").split(",") if c]
    payload = {
        "runId": str(ctx.run.pk),
        "agentId": str(ctx.agent.pk),
        "companyId": str(ctx.agent.company_id),
        "issueId": str(ctx.issue.pk) if ctx.issue is not None else None,
        "wakeReason": env.get("PAPERCLIP_WAKE_REASON", ""),
        "commentIds": comment_ids,
        "approvalId": env.get("PAPERCLIP_APPROVAL_ID"),
        "apiUrl": env.get("PAPERCLIP_API_URL", ""),
        "apiKey": env.get("PAPERCLIP_API_KEY", ""),
        "sentAt": timezone.now().isoformat(),
    }
    wake = ctx.wake
    if wake is not None:
        facts = wake.facts.as_dict()
        for key in ("wakeReason", "commentIds", "approvalId"):  # kept as the env gives them
            facts.pop(key)
        payload.update(facts, wakePayload=wake.payload, taskPacket=wake.packet)
    return payload


class HttpAdapter(Adapter):
    adapter_type = AdapterType.HTTP
    needs_run_key = True

    def validate_config(self, config: dict, *, resolve: bool = True) -> None:
        if "secret" in config:
            raise AdapterConfigError("inline secrets are not allowed: remove 'secret' and set secret_ref to 'env:NAME'")
        url = config.get("url")
        if not isinstance(url, str):
            raise AdapterConfigError("adapter_config.url must be an https URL")
        refusal = url_refusal(url, resolve=resolve)
        if refusal:
            raise AdapterConfigError(f"adapter_config.url: {refusal}")
        secret_ref_check(config.get("secret_ref"), "adapter_config.secret_ref")
        timeout = config.get("timeout_seconds", DEFAULT_TIMEOUT)
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise AdapterConfigError("adapter_config.timeout_seconds must be a positive number")

    def secrets_from_config(self, config: dict, *, company_id) -> list[str]:
        ref = config.get("secret_ref")
        return [resolve_secret_ref(ref, company_id=company_id)] if ref else []

    def execute(self, ctx: RunContext) -> AdapterResult | None:
        from issues.services.runs import run_mark_running

        config = ctx.config
        try:
            self.validate_config(config, resolve=False)  # the connection itself checks the address
            secret = resolve_secret_ref(config["secret_ref"], company_id=ctx.agent.company_id)
        except AdapterConfigError as exc:
            log_event(ctx, RunEventKind.SYSTEM, f"adapter config: {exc}")
            return AdapterResult(status=RunStatus.FAILED, error=f"adapter config: {exc}")
        secrets = [*ctx.secrets, secret, ctx.env.get("PAPERCLIP_API_KEY", "")]
        stopped = run_stop_state(ctx.run.pk)
        if stopped:
            return AdapterResult(status=RunStatus.CANCELLED, error=f"not started: {stopped}")

        body = json.dumps(wake_payload(ctx), separators=(",", ":"), sort_keys=True).encode()
        headers = {"Content-Type": "application/json", SIGNATURE_HEADER: sign(body, secret),
                   "X-Paperclip-Run-Id": str(ctx.run.pk), "User-Agent": "paperclip-wake/1"}
        url = config["url"]
        run_mark_running(run=ctx.run, owner=ctx.owner, pid=None)
        try:
            with guarded_client(timeout=float(config.get("timeout_seconds", DEFAULT_TIMEOUT))) as client:
                response = client.post(url, content=body, headers=headers)
        except OutboundRefused as exc:
            error = f"wake delivery to {url} refused: {exc}"
            log_event(ctx, RunEventKind.SYSTEM, error, secrets)
            return AdapterResult(status=RunStatus.FAILED, error=redact(error, secrets))
        except httpx.HTTPError as exc:
            error = f"wake delivery to {url} failed: {type(exc).__name__}: {exc}"
            log_event(ctx, RunEventKind.SYSTEM, error, secrets)
            return AdapterResult(status=RunStatus.FAILED, error=redact(error, secrets))
        if 200 <= response.status_code < 300:
            log_event(ctx, RunEventKind.SYSTEM, f"wake accepted by {url}: HTTP {response.status_code}", secrets,
                      httpStatus=response.status_code)
            return None
        excerpt = response.text[:500]
        log_event(ctx, RunEventKind.SYSTEM, f"wake rejected by {url}: HTTP {response.status_code}: {excerpt}",
                  secrets, httpStatus=response.status_code)
        return AdapterResult(status=RunStatus.FAILED, error=f"wake rejected: HTTP {response.status_code}")

