"""Webhook setup API (Appendix A.3-A.5, §13.2): register the provider webhooks of a connector, re-verify
them, open the handshake window, read a verification token. Thin: load the instance (another company's is
a 404), call the service (which checks the role), answer."""
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from issues.actors import actor_from_request
from issues.api.views import ERRORS

from .. import selectors
from ..services import webhook_setup


class RegistrationSerializer(serializers.Serializer):
    scope = serializers.CharField(help_text="The container the webhook is for.")
    externalId = serializers.CharField(allow_blank=True, help_text="The provider's webhook id.")
    callbackUrl = serializers.CharField(help_text="PAPERCLIP_PUBLIC_URL + the webhook path + ?scope=.")
    active = serializers.BooleanField()
    detail = serializers.CharField(allow_blank=True)
    checkedAt = serializers.CharField(allow_null=True)


REGISTRATIONS = inline_serializer("WebhookRegistrations", {"registrations": RegistrationSerializer(many=True)})


def _instance(request, instance_id):
    actor = actor_from_request(request)
    return actor, selectors.instance_get(actor=actor, pk=instance_id)


class WebhookRegisterView(APIView):
    @extend_schema(request=None, responses={200: REGISTRATIONS, **ERRORS}, operation_id="connectors_webhooks_register",
                   description="Owners and admins. Create the provider webhook of every configured container "
                               "(Asana, Trello), with the handshake window open while the provider calls back; a "
                               "container with an active registration is re-checked instead. 422 "
                               "webhook_registration_unsupported for a provider whose API cannot (Notion, GitHub, "
                               "Linear, Jira: configure them in the provider with the webhook URL). A provider "
                               "failure is shown per container (active false, detail) and as a health entry.")
    def post(self, request, instance_id):
        actor, instance = _instance(request, instance_id)
        return Response({"registrations": webhook_setup.webhooks_register(instance=instance, actor=actor)})


class WebhookVerifyView(APIView):
    @extend_schema(request=None, responses={200: REGISTRATIONS, **ERRORS}, operation_id="connectors_webhooks_verify",
                   description="Owners and admins. Ask the provider about every registration (§13.2; also done at "
                               "worker start); an inactive one is a config health entry.")
    def post(self, request, instance_id):
        actor, instance = _instance(request, instance_id)
        return Response({"registrations": webhook_setup.webhooks_reverify(instance=instance, actor=actor)})


class HandshakeWindowView(APIView):
    @extend_schema(request=None, responses={200: inline_serializer("HandshakeWindow", {
        "handshakeOpenUntil": serializers.DateTimeField()}), **ERRORS}, operation_id="connectors_handshake_window",
        description="Owners and admins. For 15 minutes, a provider handshake may replace the stored signing "
                    "secret (Notion resending its verification token, an Asana webhook re-created by hand).")
    def post(self, request, instance_id):
        actor, instance = _instance(request, instance_id)
        return Response({"handshakeOpenUntil": webhook_setup.handshake_window_open(actor=actor, instance=instance)})


class VerificationTokenView(APIView):
    @extend_schema(responses={200: inline_serializer("VerificationToken", {
        "verificationToken": serializers.CharField(allow_null=True)}), **ERRORS},
        operation_id="connectors_verification_token",
        description="Owners and admins (audited). The signing secret a handshake handed over (Notion's "
                    "verification_token), to paste back into the provider; null when none was received.")
    def get(self, request, instance_id):
        actor, instance = _instance(request, instance_id)
        response = Response({"verificationToken": webhook_setup.verification_token(actor=actor, instance=instance)})
        response["Cache-Control"] = "no-store"  # a secret: never kept by a browser or proxy
        return response
