"""``POST /api/connectors/{instanceId}/webhook``: a plain Django view (no session, no CSRF, no
DRF) so intake stays fast. The provider signature is the only authentication."""
import logging
import uuid

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.http import HttpResponse
from django.views.decorators.http import require_http_methods

from paperclip.core.errors import error_body
from paperclip.core.schema import document_plain_view

from ..choices import EventStatus
from ..providers.base import HandshakeReply, WebhookRejected, WebhookUnparseable
from ..secrets import SecretUnavailable
from ..selectors import instance_for_delivery
from ..services.common import conf, sync_error_record
from ..services.intake import MethodNotAllowed, WebhookTaskNotLinked, webhook_intake, webhook_rejected
from ..services.webhook_setup import HandshakeRefused

log = logging.getLogger("connectors.webhook")


def _error(status, code, message):
    return JsonResponse(error_body(code, message), status=status)


def _error_response(description):
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


OPENAPI_OPERATION = {
    "operationId": "connectors_webhook",
    "tags": ["connectors"],
    "summary": "A provider's webhook delivery",
    "description": "The raw body is verified against the provider's signature headers (e.g. "
                   "X-Hub-Signature-256, Linear-Signature, or the shared secret of a Jira webhook) before it "
                   "is parsed; no session, no API key and no CSRF token. Stored once per delivery id and "
                   "applied by a worker, never inside this request. A Jira connector without a webhook secret "
                   "accepts unsigned deliveries as unverified hints: the worker applies only what it reads back "
                   "through the Jira API (GitHub and Linear connectors without a secret answer 401). A delivery "
                   "that verifies but does not parse (provider schema drift) is stored raw and parked "
                   "(202, status parked, a schema_drift health entry); an operator replays it after an upgrade "
                   "(POST /api/connector-events/{id}/replay). A delivery that names no container, only its "
                   "task, is accepted only when that task is linked on this connector (else 401). Provider setup "
                   "requests are answered here too (Appendix A.3-A.5): Asana's first request carrying X-Hook-Secret "
                   "gets the header echoed (200) and the secret is stored encrypted as the signing secret; Notion's "
                   "{\"verification_token\"} request is stored the same way and shown to admins on the connector "
                   "page; Trello's HEAD callback check answers 200. A handshake that would replace a stored secret "
                   "while none is expected is 409 handshake_refused. Signatures that cover the URL (Trello) are "
                   "computed over PAPERCLIP_PUBLIC_URL + this path (+ ?scope=), never the request's Host.",
    "security": [],
    "parameters": [{"in": "path", "name": "instance_id", "required": True, "schema": {"type": "string"},
                    "description": "The connector instance id (UUID); anything else is a 404."},
                   {"in": "query", "name": "scope", "required": False, "schema": {"type": "string"},
                    "description": "The container of a per-container registration (set in the callback URL "
                                   "connector_register_webhooks gives the provider)."}],
    "requestBody": {"required": False, "description": "The provider's payload, exactly as sent.",
                    "content": {"application/json": {"schema": {}},
                                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
    "responses": {
        "202": {"description": "Stored (or already stored: duplicate) and queued (status pending); or, when "
                               "the verified body did not parse, stored raw and parked (status parked, "
                               "replayable).",
                "content": {"application/json": {"schema": {
                    "type": "object", "required": ["eventId", "idempotencyKey", "status", "duplicate"],
                    "properties": {"eventId": {"type": "integer"}, "idempotencyKey": {"type": "string"},
                                   "status": {"type": "string", "enum": list(EventStatus.values)},
                                   "duplicate": {"type": "boolean"}}}}}},
        "200": {"description": "A provider's setup request answered (handshake): no event is stored."},
        "400": _error_response("webhook_unparseable: nested deeper than PAPERCLIP_JSON_MAX_DEPTH, or unsigned "
                               "(a Jira connector without a secret) and not a payload of this provider "
                               "(nothing stored)."),
        "401": _error_response("Signature missing or invalid, or not for this connector: another container "
                               "(webhook_wrong_container) or an unlinked task named without a container "
                               "(webhook_task_not_linked). Nothing stored."),
        "404": _error_response("No such connector instance."),
        "409": _error_response("handshake_refused: a handshake would replace the stored signing secret while "
                               "none is expected (nothing stored)."),
        "413": _error_response("payload_too_large: over CONNECTORS WEBHOOK_MAX_BODY_BYTES."),
        "503": _error_response("provider_unavailable / webhook_secret_unavailable."),
    },
}


def _handshake_response(reply: HandshakeReply, method: str):
    """What the provider's setup request gets: its status and headers (Asana's echoed X-Hook-Secret), a
    JSON body when the adapter gave one, and never a body for HEAD."""
    if reply.body is not None and method != "HEAD":
        response = JsonResponse(dict(reply.body), status=reply.status)
    else:
        response = HttpResponse(status=reply.status)
    for name, value in reply.headers.items():
        response[name] = value
    return response


@document_plain_view("/api/connectors/{instance_id}/webhook", "post", OPENAPI_OPERATION)
@csrf_exempt
@require_http_methods(["POST", "HEAD"])
def webhook(request, instance_id):
    try:
        pk = uuid.UUID(str(instance_id))
    except ValueError:
        return _error(404, "not_found", "Not found.")
    instance = instance_for_delivery(pk)
    if instance is None:
        return _error(404, "not_found", "Not found.")
    limit = int(conf("WEBHOOK_MAX_BODY_BYTES"))
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        return _error(413, "payload_too_large", f"Webhook bodies are limited to {limit} bytes.")
    body = request.read(limit + 1)
    if len(body) > limit:
        return _error(413, "payload_too_large", f"Webhook bodies are limited to {limit} bytes.")
    headers = {k.lower(): v for k, v in request.headers.items()}
    # ?scope=: the container a per-container registration named in its callback URL (it picks that
    # registration's signing secret; an unknown scope falls back to the instance's secret).
    scope = (request.GET.get("scope") or "").strip()[:200] or None
    try:
        result = webhook_intake(instance=instance, body=body, headers=headers, method=request.method, scope=scope)
    except WebhookRejected as exc:
        webhook_rejected(instance.pk, str(exc))
        code = "webhook_task_not_linked" if isinstance(exc, WebhookTaskNotLinked) else \
            exc.category if exc.category != "provider_payload" else "webhook_wrong_container"
        return _error(401, code, "Webhook rejected: signature missing or invalid, or not for this connector.")
    except MethodNotAllowed:
        response = _error(405, "method_not_allowed", "Webhook deliveries are POST requests.")
        response["Allow"] = "POST"
        return response
    except HandshakeRefused as exc:
        webhook_rejected(instance.pk, f"handshake refused: {exc}")
        return _error(409, "handshake_refused", str(exc))
    except WebhookUnparseable as exc:
        return _error(400, "webhook_unparseable", str(exc) or "Unparseable webhook payload.")
    except LookupError as exc:  # the instance's provider module is not installed
        sync_error_record(instance=instance, category="config", message=f"Webhook refused: {exc}")
        return _error(503, "provider_unavailable", "The connector's provider is not available.")
    except SecretUnavailable as exc:
        webhook_rejected(instance.pk, f"secret unavailable: {exc}")
        sync_error_record(instance=instance, category="provider_auth", message=f"Webhook secret unavailable: {exc}")
        return _error(503, "webhook_secret_unavailable", "The connector's webhook secret is not available.")
    if isinstance(result, HandshakeReply):
        return _handshake_response(result, request.method)
    event = result.event
    return JsonResponse({"eventId": event.pk, "idempotencyKey": event.idempotency_key, "status": event.status,
                         "duplicate": not result.created}, status=202)
