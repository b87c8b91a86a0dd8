"""Board API keys over the API (upstream Paperclip §2.5): a board user lists, creates and revokes
their own ``pcp_board_…`` keys; agents get 403 ``board_only``. Thin views over
``issues.services.board_keys``."""
import uuid
from datetime import timedelta

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from issues import selectors
from issues.actors import actor_from_request
from issues.exceptions import InvalidInput
from issues.services import board_keys as board_key_services

from .serializers import IdField, StrictSerializer
from .views import ERRORS, LIST_PARAMS, parse

MAX_EXPIRES_IN_DAYS = 36500  # a century: far enough, and inside every datetime type


class BoardApiKeySerializer(serializers.Serializer):
    """A key's metadata; the token is never shown again."""

    id = serializers.UUIDField()
    name = serializers.CharField()
    prefix = serializers.CharField(help_text="The token's first characters, to recognise it.")
    expiresAt = serializers.DateTimeField(source="expires_at", allow_null=True, help_text="Null: never expires.")
    lastUsedAt = serializers.DateTimeField(source="last_used_at", allow_null=True)
    revokedAt = serializers.DateTimeField(source="revoked_at", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")


class BoardApiKeyCreatedSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    prefix = serializers.CharField()
    token = serializers.CharField(help_text="pcp_board_…: shown only in this response (only its hash is stored).")
    expiresAt = serializers.DateTimeField(source="expires_at", allow_null=True)
    lastUsedAt = serializers.DateTimeField(source="last_used_at", allow_null=True)
    revokedAt = serializers.DateTimeField(source="revoked_at", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")


class BoardApiKeyCreateSerializer(StrictSerializer):
    name = serializers.CharField(required=False, max_length=120, help_text='Default "default".')
    expiresInDays = serializers.IntegerField(required=False, min_value=1, max_value=MAX_EXPIRES_IN_DAYS)
    expiresAt = serializers.DateTimeField(required=False, allow_null=True,
                                          help_text="Omitted: 30 days from now; null: never expires.")
    # Upstream's CLI sends the company it asked from; keys act with all of the user's companies.
    requestedCompanyId = IdField(required=False, allow_null=True, help_text="Accepted and ignored (as upstream, "
                                                                            "the key is not company-scoped).")

    def validate(self, data):
        if "expiresInDays" in data and "expiresAt" in data:
            message = ["Give expiresInDays or expiresAt, not both."]
            raise serializers.ValidationError({"expiresInDays": message, "expiresAt": message})
        return data


class BoardApiKeyRevokedSerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    keyId = serializers.UUIDField()


INCLUDE_INACTIVE = OpenApiParameter("includeInactive", OpenApiTypes.BOOL,
                                    description="Also list revoked and expired keys (default false).")


class BoardApiKeysView(APIView):
    @extend_schema(parameters=[INCLUDE_INACTIVE, *LIST_PARAMS],
                   responses={200: BoardApiKeySerializer(many=True), **ERRORS}, operation_id="board_api_keys_list")
    def get(self, request):
        actor = actor_from_request(request)
        actor.ensure_board()
        keys = selectors.board_key_list(user=actor.user, params=request.query_params)
        return Response(BoardApiKeySerializer(keys, many=True).data)

    @extend_schema(request=BoardApiKeyCreateSerializer, responses={201: BoardApiKeyCreatedSerializer, **ERRORS},
                   operation_id="board_api_keys_create")
    def post(self, request):
        actor = actor_from_request(request)
        actor.ensure_board()
        data = parse(BoardApiKeyCreateSerializer, request)
        expires_at = board_key_services.DEFAULT_EXPIRY
        if "expiresInDays" in data:
            expires_at = timezone.now() + timedelta(days=data["expiresInDays"])
        elif "expiresAt" in data:
            expires_at = data["expiresAt"]
        key, token = board_key_services.board_key_create(actor=actor, user=actor.user,
                                                         name=data.get("name") or "default", expires_at=expires_at)
        key.token = token
        response = Response(BoardApiKeyCreatedSerializer(key).data, status=status.HTTP_201_CREATED)
        response["Cache-Control"] = "no-store"
        return response


class BoardApiKeyView(APIView):
    @extend_schema(request=None, responses={200: BoardApiKeyRevokedSerializer, **ERRORS},
                   operation_id="board_api_keys_revoke")
    def delete(self, request, key_id):
        actor = actor_from_request(request)
        try:
            key_id = uuid.UUID(key_id)
        except ValueError:
            raise InvalidInput("Invalid board API key ID", details={"keyId": ["Must be a UUID."]})
        key = board_key_services.board_key_of(actor=actor, key_id=key_id)
        key = board_key_services.board_key_revoke(actor=actor, key=key)
        return Response({"ok": True, "keyId": str(key.pk)})
