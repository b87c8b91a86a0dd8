"""Connector setup validation API: check the state mapping against the provider's live workflow (§7.2).
Thin: load the instance (another company's is a 404), call the service, serialize."""
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from issues.actors import actor_from_request
from issues.api.views import ERRORS

from .. import selectors
from ..services.mapping_check import INVALID, NOT_APPLICABLE, OK, UNAVAILABLE, state_mapping_check


class MappingIssueSerializer(serializers.Serializer):
    field = serializers.CharField(help_text="Configuration path, e.g. stateMapping.projects.PC.statuses.Shipped.")
    container = serializers.CharField(allow_null=True)
    reason = serializers.CharField()


class MappingProviderErrorSerializer(serializers.Serializer):
    container = serializers.CharField(allow_null=True)
    category = serializers.CharField(help_text="§5.4 error category (provider_auth, provider_rate_limited, ...).")
    message = serializers.CharField()
    retryAfter = serializers.FloatField(allow_null=True)


class MappingStateSerializer(serializers.Serializer):
    name = serializers.CharField()
    category = serializers.CharField()
    mapped = serializers.BooleanField()


class MappingContainerSerializer(serializers.Serializer):
    container = serializers.CharField()
    checked = serializers.BooleanField()
    states = MappingStateSerializer(many=True)


class MappingCheckSerializer(serializers.Serializer):
    instanceId = serializers.CharField()
    providerKey = serializers.CharField()
    status = serializers.ChoiceField(choices=[OK, INVALID, UNAVAILABLE, NOT_APPLICABLE])
    checkedAt = serializers.DateTimeField()
    message = serializers.CharField()
    containers = MappingContainerSerializer(many=True)
    errors = MappingIssueSerializer(many=True)
    warnings = MappingIssueSerializer(many=True)
    providerErrors = MappingProviderErrorSerializer(many=True)


class ConnectorCheckMappingView(APIView):
    @extend_schema(request=None, responses={200: MappingCheckSerializer, **ERRORS},
                   operation_id="connectors_check_mapping",
                   description="Board writers. Check the state mapping (named and per-container overrides, "
                               "config.outboundStates) against each container's live workflow. status: ok, invalid "
                               "(errors, also recorded as a config health entry), unavailable (the provider could "
                               "not be read: see providerErrors) or not_applicable (no workflow metadata, e.g. "
                               "GitHub). Always 200 once the check ran.")
    def post(self, request, instance_id):
        actor = actor_from_request(request)
        instance = selectors.instance_get(actor=actor, pk=instance_id)
        return Response(MappingCheckSerializer(state_mapping_check(actor=actor, instance=instance)).data)
