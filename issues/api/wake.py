"""A pending wake is observable (issue #13): the agent's own wakes and the context of its run,
and the board's upstream-compatible run lists (paperclip-api.md §5.1)."""
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from issues import run_context, selectors
from issues.actors import actor_from_request
from issues.services.agents import ensure_agent

from .serializers import RunSerializer
from .views import ERRORS, RUN_HEADER_PARAM


# --- serializers -----------------------------------------------------------------------------------

class PendingWakeSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    reason = serializers.CharField()
    source = serializers.CharField()
    issueId = serializers.UUIDField(source="issue_id", allow_null=True)
    status = serializers.CharField()
    runId = serializers.UUIDField(source="run_id", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")


class LiveRunBriefSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    status = serializers.CharField()
    wakeReason = serializers.CharField(source="wake_reason")
    wakeReasons = serializers.SerializerMethodField()
    issueId = serializers.UUIDField(source="issue_id", allow_null=True)
    scheduledFor = serializers.DateTimeField(source="scheduled_for", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")

    def get_wakeReasons(self, run) -> list[str]:
        return run_context.wake_facts(run).reasons


class ContinuationSerializer(serializers.Serializer):
    attempt = serializers.IntegerField()
    instruction = serializers.CharField()


class RunWakeContextSerializer(serializers.Serializer):
    """The same fields an ``http`` agent gets in its signed wake payload (issues.run_context)."""

    runId = serializers.UUIDField()
    wakeReason = serializers.CharField()
    wakeReasons = serializers.ListField(child=serializers.CharField())
    commentIds = serializers.ListField(child=serializers.CharField())
    wakeCommentId = serializers.CharField(allow_null=True)
    approvalId = serializers.CharField(allow_null=True)
    approvalStatus = serializers.CharField(allow_null=True)
    linkedIssueIds = serializers.ListField(child=serializers.CharField())
    interactionId = serializers.CharField(allow_null=True)
    interactionStatus = serializers.CharField(allow_null=True)
    blockerIssueIds = serializers.ListField(child=serializers.CharField())
    childIssueIds = serializers.ListField(child=serializers.CharField())
    continuation = ContinuationSerializer(allow_null=True)
    retryAttempt = serializers.IntegerField(allow_null=True)
    connectorLinkId = serializers.CharField(allow_null=True)
    taskPacket = serializers.CharField()


class AgentWakeSerializer(serializers.Serializer):
    agentId = serializers.UUIDField()
    pendingWakes = PendingWakeSerializer(many=True)
    runs = LiveRunBriefSerializer(many=True)
    currentRun = RunWakeContextSerializer(allow_null=True)


class RunListItemSerializer(RunSerializer):
    """A run in a list: the full context (packets can be large) is left out; its reasons are not."""

    wakeReasons = serializers.SerializerMethodField()

    def get_fields(self):
        fields = super().get_fields()
        fields.pop("context")
        return fields

    def get_wakeReasons(self, run) -> list[str]:
        reasons = getattr(run, "wake_reasons", None)
        return [str(r) for r in reasons] if isinstance(reasons, list) else ([run.wake_reason] if run.wake_reason
                                                                            else [])


class IssueRunSerializer(RunListItemSerializer):
    """A run in an issue's run list, with upstream's ``runId`` and ``adapterType`` beside ``id``."""

    runId = serializers.UUIDField(source="id")
    adapterType = serializers.CharField(source="adapter_type")


# Upstream's triggerDetail (manual|ping|callback|system) from our invocation source: an on-demand
# wake is someone asking (manual); timers, assignments and automations are the system's own; a
# connector wake answers an outside event (callback). ``ping`` has no source of ours.
TRIGGER_DETAIL = {"on_demand": "manual", "timer": "system", "assignment": "system", "automation": "system",
                  "connector": "callback"}


def trigger_detail(run) -> str | None:
    """Upstream's ``triggerDetail`` of a run, derived from its invocation source."""
    return TRIGGER_DETAIL.get(run.invocation_source)


class LiveRunSerializer(serializers.Serializer):
    """A queued or running run (upstream's live-runs item). ``triggerDetail`` is derived from
    ``invocationSource``: on_demand -> manual; timer, assignment, automation -> system;
    connector -> callback (see ``TRIGGER_DETAIL``)."""

    id = serializers.UUIDField()
    status = serializers.CharField()
    invocationSource = serializers.CharField(source="invocation_source")
    triggerDetail = serializers.SerializerMethodField()
    startedAt = serializers.DateTimeField(source="started_at", allow_null=True)
    finishedAt = serializers.DateTimeField(source="finished_at", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")
    agentId = serializers.UUIDField(source="agent_id")
    agentName = serializers.CharField(source="agent.name")
    adapterType = serializers.CharField(source="adapter_type")
    issueId = serializers.UUIDField(source="issue_id", allow_null=True)

    @extend_schema_field({"type": "string", "enum": ["manual", "ping", "callback", "system"], "nullable": True})
    def get_triggerDetail(self, run):
        return trigger_detail(run)


# --- views -------------------------------------------------------------------------------------------

class AgentMeWakeView(APIView):
    @extend_schema(
        parameters=[RUN_HEADER_PARAM], responses={200: AgentWakeSerializer, **ERRORS}, operation_id="agents_me_wake",
        description="The calling agent's pending wakes (queued, deferred behind another run's lock, or claimed by "
                    "a run that has not started) and its live runs with their wake reasons (oldest first; the "
                    "last is the newest, which the run starts with). With a run-scoped key or the run header, "
                    "`currentRun` is that run's wake context: the fields an http agent gets in its wake payload "
                    "and the task packet a process agent finds at PAPERCLIP_TASK_PACKET_PATH.",
    )
    def get(self, request):
        actor = actor_from_request(request)
        ensure_agent(actor)  # 401 for a board credential, as /agents/me
        current = None
        # A run-scoped key implies its run; a long-lived key's own client run id names no host run.
        if actor.run_header and actor.run is not None:
            current = run_context.run_context_view(selectors.run_with_pending_wakes(actor.run))
        body = {"agentId": actor.agent.pk, "pendingWakes": selectors.agent_pending_wakes(agent=actor.agent),
                "runs": selectors.agent_live_runs(agent=actor.agent), "currentRun": current}
        return Response(AgentWakeSerializer(body).data)


class CompanyHeartbeatRunsView(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("agentId", OpenApiTypes.UUID, description="Only this agent's runs."),
                    OpenApiParameter("limit", {"type": "integer", "minimum": 1,
                                               "maximum": selectors.RUN_LIST_MAX_LIMIT},
                                     description=f"How many (default {selectors.RUN_LIST_DEFAULT_LIMIT}).")],
        responses={200: RunListItemSerializer(many=True), **ERRORS}, operation_id="companies_heartbeat_runs",
        description="The company's runs, newest first (upstream-compatible bare array).",
    )
    def get(self, request, company_id):
        company = actor_from_request(request).company(company_id)
        runs = selectors.company_runs(company=company, params=request.query_params)
        return Response(RunListItemSerializer(runs, many=True).data)


class CompanyLiveRunsView(APIView):
    @extend_schema(responses={200: LiveRunSerializer(many=True), **ERRORS}, operation_id="companies_live_runs",
                   description="The company's queued and running runs, newest first.")
    def get(self, request, company_id):
        company = actor_from_request(request).company(company_id)
        return Response(LiveRunSerializer(selectors.company_live_runs(company=company), many=True).data)
