"""One JSON error shape for the whole API, readable by upstream Paperclip clients:
``{"error": "<human message>", "code": "<machine code>", "details": {...}}`` (upstream's top-level
``error`` string, with its late top-level ``code`` and ``details`` beside it).

Services raise :class:`ApiError` subclasses (domain errors that know their status code);
everything DRF or Django raises is mapped onto the same shape here.
"""
from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, JsonResponse
from rest_framework import exceptions as drf
from rest_framework.response import Response


class ApiError(Exception):
    status_code = 400
    code = "bad_request"
    message = "Bad request."

    def __init__(self, message=None, *, code=None, details=None, status_code=None):
        self.message = message or self.message
        self.code = code or self.code
        self.details = details if details is not None else {}
        if status_code is not None:
            self.status_code = status_code
        super().__init__(self.message)


class NotFound(ApiError):
    status_code = 404
    code = "not_found"
    message = "Not found."


class Forbidden(ApiError):
    status_code = 403
    code = "forbidden"
    message = "You do not have permission to perform this action."


class Unauthorized(ApiError):
    status_code = 401
    code = "unauthorized"
    message = "Authentication is required."


class Conflict(ApiError):
    status_code = 409
    code = "conflict"
    message = "Conflict."


class Unprocessable(ApiError):
    status_code = 422
    code = "unprocessable"
    message = "The request cannot be applied."


class InvalidInput(ApiError):
    status_code = 400
    code = "validation_error"
    message = "Invalid input."


def error_text(exc: ApiError) -> str:
    """One line for a flash message (console, admin): the message and the field reasons."""
    parts = [exc.message]
    details = exc.details if isinstance(exc.details, dict) else {}
    for field, reasons in details.items():
        if isinstance(reasons, (list, tuple)):
            parts.append(f"{field}: {' '.join(str(r) for r in reasons)}")
    return " — ".join(parts)


def error_body(code, message, details=None):
    return {"error": str(message), "code": code, "details": details or {}}


_DRF_CODES = {
    drf.ParseError: "malformed_json",
    drf.NotAuthenticated: "unauthorized",
    drf.AuthenticationFailed: "unauthorized",
    drf.PermissionDenied: "forbidden",
    drf.NotFound: "not_found",
    drf.MethodNotAllowed: "method_not_allowed",
    drf.NotAcceptable: "not_acceptable",
    drf.UnsupportedMediaType: "unsupported_media_type",
    drf.Throttled: "throttled",
}


def _drf_error(exc):
    if isinstance(exc, drf.ValidationError):
        details = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        return Response(error_body("validation_error", "Invalid input.", details), status=400)
    code = next((c for cls, c in _DRF_CODES.items() if isinstance(exc, cls)), "error")
    headers = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header
    return Response(error_body(code, exc.detail), status=exc.status_code, headers=headers)


def payload_too_large_body() -> dict:
    """The 413 for a body over DATA_UPLOAD_MAX_MEMORY_SIZE (PAPERCLIP_MAX_REQUEST_BYTES)."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return error_body("payload_too_large", f"Request bodies are limited to {limit} bytes.", {"maxBytes": limit})


def exception_handler(exc, context):
    if isinstance(exc, RequestDataTooBig):  # raised by Django when the parser reads request.body
        return Response(payload_too_large_body(), status=413)
    if isinstance(exc, ApiError):
        return Response(error_body(exc.code, exc.message, exc.details), status=exc.status_code)
    if isinstance(exc, Http404):
        return Response(error_body("not_found", "Not found."), status=404)
    if isinstance(exc, DjangoPermissionDenied):
        return Response(error_body("forbidden", "Permission denied."), status=403)
    if isinstance(exc, DjangoValidationError):
        details = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        return Response(error_body("validation_error", "Invalid input.", details), status=400)
    if isinstance(exc, drf.APIException):
        response = _drf_error(exc)
        if isinstance(exc, drf.NotAuthenticated | drf.AuthenticationFailed):
            auth = context["request"].successful_authenticator if context.get("request") else None
            response["WWW-Authenticate"] = 'Bearer realm="api"' if auth is None else response.get("WWW-Authenticate", "")
        return response
    return None


def json_not_found(request, exception=None):
    """handler404: JSON under /api/, Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse(error_body("not_found", "Not found."), status=404)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)


def json_server_error(request):
    if request.path.startswith("/api/"):
        return JsonResponse(error_body("server_error", "Internal server error."), status=500)
    from django.views.defaults import server_error

    return server_error(request)
