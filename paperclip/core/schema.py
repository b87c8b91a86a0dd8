"""What the generated OpenAPI schema (drf-spectacular) must say beyond what fields and views tell it.

- Input serializers deriving from ``issues.api.serializers.StrictSerializer`` refuse unknown fields
  (400 naming them): their request components say ``additionalProperties: false``.
- Plain Django views (no DRF, e.g. the signature-verified connector webhook) are described with
  :func:`document_plain_view` and added by the :func:`add_plain_views` postprocessing hook.
- Every operation that takes a request body may answer 413 (over DATA_UPLOAD_MAX_MEMORY_SIZE) and
  415 (not JSON) in the one error shape: :func:`add_body_errors`.

Imported by ``CoreConfig.ready()`` so that the extension is registered before any schema is built.
"""
from drf_spectacular.extensions import OpenApiSerializerExtension


class StrictSerializerScheme(OpenApiSerializerExtension):
    target_class = "issues.api.serializers.StrictSerializer"
    match_subclasses = True

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        schema["additionalProperties"] = False
        return schema


# A JSON value of any type but null (OpenAPI 3.0 has no "not null" for an untyped schema).
NON_NULL_JSON = {"anyOf": [{"type": "object", "additionalProperties": True}, {"type": "array", "items": {}},
                           {"type": "string"}, {"type": "number"}, {"type": "boolean"}]}


_PLAIN_VIEWS: dict[tuple[str, str], dict] = {}


def document_plain_view(path: str, method: str, operation: dict):
    """Decorator: ``operation`` (an OpenAPI operation object) documents ``method path`` (the path in
    the schema's own form, e.g. ``/api/connectors/{instance_id}/webhook``) for a non-DRF view."""

    def register(view):
        _PLAIN_VIEWS[(path, method.lower())] = operation
        return view

    return register


def add_plain_views(result, generator, request, public):
    """drf-spectacular postprocessing hook: the operations registered by :func:`document_plain_view`."""
    for (path, method), operation in _PLAIN_VIEWS.items():
        result.setdefault("paths", {}).setdefault(path, {})[method] = operation
    return result


BODY_ERRORS = {
    "413": "payload_too_large: the body is over the request size limit.",
    "415": "unsupported_media_type: the body is not application/json.",
}


def add_body_errors(result, generator, request, public):
    """drf-spectacular postprocessing hook: 413 (and 415 where only JSON is taken), in the Error
    component, on every operation with a request body that does not document them itself."""
    for methods in result.get("paths", {}).values():
        for operation in methods.values():
            if not isinstance(operation, dict) or "requestBody" not in operation:
                continue
            for code, description in BODY_ERRORS.items():
                if code == "415" and set(operation["requestBody"].get("content", {})) != {"application/json"}:
                    continue  # takes other media types (e.g. a webhook's raw body)
                operation.setdefault("responses", {}).setdefault(code, {
                    "description": description,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
                })
    return result
