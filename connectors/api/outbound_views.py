"""Operator replay of parked and failed outbound writes (§13.3): one effect, or every parked/failed
effect of an instance. Board users who may write to the company; audited, idempotent on the key."""
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from issues.actors import actor_from_request
from issues.api.views import ERRORS, parse

from .. import selectors
from ..services import interventions as iv
from ..services.outbound_replay import effect_replay, instance_outbound_replay
from .serializers import InterventionSerializer


class EffectReplayResultSerializer(serializers.Serializer):
    interventionId = serializers.IntegerField()
    replayed = serializers.BooleanField(help_text="True when this idempotency key was already used (same answer).")
    effectId = serializers.IntegerField()
    status = serializers.CharField(help_text="pending (queued for delivery) or cancelled (superseded).")
    outcome = serializers.ChoiceField(choices=["queued", "superseded"])


class InstanceReplayResultSerializer(serializers.Serializer):
    interventionId = serializers.IntegerField()
    replayed = serializers.BooleanField(help_text="True when this idempotency key was already used (same answer).")
    status = serializers.CharField()
    replayedCount = serializers.IntegerField()
    effectIds = serializers.ListField(child=serializers.IntegerField())
    supersededEffectIds = serializers.ListField(
        child=serializers.IntegerField(), help_text="State writes a later delivered state write replaced: cancelled.")


class OutboundEffectReplayView(APIView):
    @extend_schema(request=InterventionSerializer, responses={200: EffectReplayResultSerializer, **ERRORS},
                   operation_id="connector_outbound_replay",
                   description="Queue a parked or failed outbound write again (fresh retry horizon, delivered in "
                               "its link's order, a comment is never posted twice). 422 outbound_not_replayable "
                               "for any other status.")
    def post(self, request, effect_id):
        actor = actor_from_request(request)
        effect = selectors.outbound_effect_get(actor=actor, pk=effect_id)
        iv.require_board(actor)
        data = parse(InterventionSerializer, request)
        return Response(effect_replay(actor=actor, effect=effect, idempotency_key=data["idempotencyKey"],
                                      reason=data["reason"]))


class ConnectorOutboundReplayView(APIView):
    @extend_schema(request=InterventionSerializer, responses={200: InstanceReplayResultSerializer, **ERRORS},
                   operation_id="connectors_outbound_replay",
                   description="Queue every parked and failed outbound write of the instance again (one audited "
                               "intervention).")
    def post(self, request, instance_id):
        actor = actor_from_request(request)
        instance = selectors.instance_get(actor=actor, pk=instance_id)
        iv.require_board(actor)
        data = parse(InterventionSerializer, request)
        return Response(instance_outbound_replay(actor=actor, instance=instance,
                                                 idempotency_key=data["idempotencyKey"], reason=data["reason"]))
