"""The PRP HTTP transport (``/api/runner/v1/runs/{runId}/…``): thin views over issues.runner.

Only the run's own run-scoped key authenticates (issues.runner.auth); another run's id is a 404.
On an ended run, within RUNNER_ACK_GRACE_SECONDS of its end, the run's (then revoked) key may
still re-deliver events (exact duplicates: re-acknowledged) and post command results; anything
else is 409 ``run_not_live``.
"""
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from issues.api.auth import AgentKeyAuthentication
from issues.choices import RUNNER_COMMAND_RESULTS
from issues.runner import attach, intake, negotiation, offers
from issues.runner.auth import RunnerKeyAuthentication, runner_key_run

from .serializers import ErrorSerializer

ERRORS = {code: ErrorSerializer for code in (400, 401, 403, 404, 409, 413)}


# --- schema documentation (the bodies are validated against the PRP contract, not these) -------
class HelloSerializer(serializers.Serializer):
    protocolMin = serializers.IntegerField(min_value=1)
    protocolMax = serializers.IntegerField(min_value=1)
    runnerInstanceId = serializers.CharField(max_length=160)
    capabilities = serializers.JSONField(help_text="paperclip.prp.capabilities.v1 or .v2 (v2: sessionGoals).")
    identity = serializers.JSONField(required=False, help_text="normalizedSessionId, driverSessionId, …")


class HelloResultSerializer(serializers.Serializer):
    protocolVersion = serializers.IntegerField()
    capabilities = serializers.JSONField()
    sources = serializers.DictField(child=serializers.IntegerField(), help_text="sourceKey -> ackedSourceSeq")
    controllerSeq = serializers.IntegerField(help_text="The last command issued.")
    supportedVersions = serializers.ListField(child=serializers.IntegerField())
    limits = serializers.DictField(child=serializers.IntegerField(),
                                   help_text="maxBatchEvents and maxBatchBytes: what one events request may carry.")


class EventBatchSerializer(serializers.Serializer):
    events = serializers.ListField(child=serializers.JSONField(), max_length=100,
                                   help_text="PRP event envelopes (paperclip.prp.event.vN), at most 100, 1 MiB.")


class GapSerializer(serializers.Serializer):
    sourceKey = serializers.CharField()
    expectedSeq = serializers.IntegerField()
    heldSeqs = serializers.ListField(child=serializers.IntegerField())
    sourceEventIds = serializers.ListField(child=serializers.CharField())


class EventAckSerializer(serializers.Serializer):
    ackedSourceSeq = serializers.IntegerField(help_text="Cumulative: every event of the batch's (first) source "
                                                        "up to this sequence is committed.")
    acks = serializers.DictField(child=serializers.IntegerField(), help_text="sourceKey -> ackedSourceSeq")
    accepted = serializers.IntegerField()
    duplicates = serializers.ListField(child=serializers.CharField())
    expected = serializers.DictField(child=serializers.IntegerField(), required=False)
    gaps = GapSerializer(many=True, required=False)


class CommandListSerializer(serializers.Serializer):
    commands = serializers.ListField(child=serializers.JSONField(), help_text="paperclip.prp.command.vN, in "
                                                                             "controllerSeq order.")
    controllerSeq = serializers.IntegerField(help_text="The last command issued.")


class CommandResultSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=list(RUNNER_COMMAND_RESULTS))
    result = serializers.JSONField(required=False)
    error = serializers.JSONField(required=False)


class CommandResultStoredSerializer(serializers.Serializer):
    commandId = serializers.CharField()
    controllerSeq = serializers.IntegerField()
    status = serializers.CharField()
    result = serializers.JSONField()
    resultAt = serializers.DateTimeField()
    duplicate = serializers.BooleanField()


class RunnerView(APIView):
    authentication_classes = [RunnerKeyAuthentication]
    permission_classes = [IsAuthenticated]

    def live_only(self, request, run):
        if request.auth.runner_grace:
            raise negotiation.run_not_live(run)


class RunnerHelloView(RunnerView):
    @extend_schema(request=HelloSerializer, responses={200: HelloResultSerializer, **ERRORS},
                   operation_id="runner_hello",
                   description="Negotiates the protocol version (the highest both support, or 400 "
                               "`unsupported_required_version`) and stores the capability snapshot. A repeated "
                               "hello answers the current cursors; changing the version after events is a 409.")
    def post(self, request, run_id):
        run = runner_key_run(request, run_id)
        self.live_only(request, run)
        return Response(negotiation.runner_hello(run=run, body=request.data))


class RunnerEventsView(RunnerView):
    @extend_schema(request=EventBatchSerializer, responses={200: EventAckSerializer, **ERRORS},
                   operation_id="runner_events",
                   description="Commits a batch of envelopes in one transaction, then answers the cumulative "
                               "acknowledgement. Duplicates (same canonical bytes) are re-acknowledged; different "
                               "bytes for a known sourceEventId are 409 `event_conflict`; a forward gap is not "
                               "acknowledged past (`expected`, `gaps`).")
    def post(self, request, run_id):
        run = runner_key_run(request, run_id)
        limit = intake.max_batch_bytes()
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > limit:
            raise intake.body_too_large(declared)  # refused before the body is read
        if len(request.body) > limit:
            raise intake.body_too_large(len(request.body))
        return Response(intake.runner_events(run=run, body=request.data))


class RunnerCommandsView(RunnerView):
    @extend_schema(
        parameters=[OpenApiParameter("afterSeq", {"type": "integer", "minimum": 0}, description="Commands after "
                                     "this controllerSeq."),
                    OpenApiParameter("wait", OpenApiTypes.NUMBER, description="Long-poll up to this many seconds "
                                     "(capped by RUNNER_COMMAND_WAIT_SECONDS) when none is newer.")],
        responses={200: CommandListSerializer, **ERRORS}, operation_id="runner_commands")
    def get(self, request, run_id):
        run = runner_key_run(request, run_id)
        self.live_only(request, run)
        after, wait = offers.parse_offer_params(request.query_params)
        return Response(offers.runner_commands(run=run, after_seq=after, wait=wait))


class RunnerCommandResultView(RunnerView):
    @extend_schema(request=CommandResultSerializer, responses={200: CommandResultStoredSerializer, **ERRORS},
                   operation_id="runner_command_result",
                   description="Stores the runner's result of a command once; the same body again answers the "
                               "stored result, a different one is 409 `command_result_conflict`.")
    def post(self, request, run_id, command_id):
        run = runner_key_run(request, run_id)
        return Response(offers.runner_command_result(run=run, command_id=command_id, body=request.data))


class AttachSerializer(serializers.Serializer):
    runId = serializers.UUIDField()
    runnerUrl = serializers.URLField(help_text="Where the runner says hello: <api>/api/runner/v1/runs/<runId>/.")
    apiKey = serializers.CharField(help_text="The run-scoped key (shown once; revoked when the run ends).")
    env = serializers.DictField(child=serializers.CharField(), help_text="The agent environment (PAPERCLIP_*) "
                                                                         "for the harness's command.")


class RunnerAttachView(APIView):
    """A runner outside the host asks for the agent's next external ``prp`` run."""

    authentication_classes = [AgentKeyAuthentication]
    permission_classes = [IsAuthenticated]

    @extend_schema(request=None, responses={200: AttachSerializer, 204: None, **ERRORS}, operation_id="runner_attach",
                   description="With the agent's long-lived key: claims the agent's oldest running run whose "
                               "adapter is `prp` with `launch: \"external\"` and no runner yet, and answers its "
                               "run-scoped key and runner URL (204 when no run waits). A run-scoped key is 403 "
                               "`agent_key_required`.")
    def post(self, request):
        if request.auth.run_id is not None:
            raise attach.agent_key_required()
        claimed = attach.runner_attach(agent=request.user)
        return Response(claimed) if claimed else Response(status=204)

