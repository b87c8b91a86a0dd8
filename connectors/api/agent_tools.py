"""Connector agent tools (§10.1, §11.3) on the agent REST API: an agent lists the open conflicts of
its issues' links, resolves them, and comments on a linked external task. Thin views: the rules
(assignment, checkout by the calling run, unlink for board users only, write policy) live in
``connectors.services.agent_tools`` and ``conflicts.conflict_resolve``; another company's ids are 404."""
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from issues.actors import actor_from_request
from issues.api.serializers import StrictSerializer
from issues.api.views import ERRORS, LIST_PARAMS, RUN_HEADER_PARAM, parse
from issues.models import Issue
from issues.selectors import get_by_ref

from .. import selectors
from ..models import Conflict
from ..services import agent_tools as tools
from ..services.conflicts import conflict_get, conflict_resolve
from . import serializers as s


class AgentConflictResolveSerializer(StrictSerializer):
    action = serializers.ChoiceField(choices=["keep_paperclip", "keep_external", "merge_manual", "unlink", "dismiss"],
                                     help_text="unlink is reserved to board users (403 board_only).")
    mergedValue = s.MergedValueField(required=False)
    idempotencyKey = serializers.CharField(max_length=200)


class AgentLinkCommentSerializer(StrictSerializer):
    body = serializers.CharField(max_length=tools.COMMENT_MAX_LENGTH, trim_whitespace=False)
    idempotencyKey = serializers.CharField(max_length=200)


class AgentLinkCommentResultSerializer(s.OutboundEffectSerializer):
    replayed = serializers.BooleanField(help_text="True when the idempotency key named an earlier comment.")


class AgentConflictsView(APIView):
    @extend_schema(
        operation_id="agent_tools_connector_conflicts_list",
        parameters=[OpenApiParameter("issue", OpenApiTypes.STR,
                                     description="Issue id or identifier; it must be assigned to you. "
                                                 "Without it: every issue assigned to you."), *LIST_PARAMS],
        responses={200: s.ConflictDetailSerializer(many=True), **ERRORS},
        description="Agents only. Open conflicts (§11) on the connector links of your issues.")
    def get(self, request):
        actor = actor_from_request(request)
        ref = request.query_params.get("issue")
        issue = get_by_ref(Issue.objects.all(), actor, ref, "Issue") if ref else None  # 404 before 403
        tools.require_agent(actor)
        rows = tools.agent_conflicts(actor=actor, issue=issue, params=request.query_params)
        return Response(s.ConflictDetailSerializer(rows, many=True).data)


class AgentConflictResolveView(APIView):
    @extend_schema(
        operation_id="agent_tools_connector_conflicts_resolve", parameters=[RUN_HEADER_PARAM],
        request=AgentConflictResolveSerializer, responses={200: s.ConflictDetailSerializer, **ERRORS},
        description="Agents only, on an issue assigned to you and checked out by the run in the run header "
                    "(409 not_checkout_owner otherwise). Same service, outcome and audit as the board's "
                    "resolve; the activity entry names your agent and run. 409 conflict_not_open when it "
                    "was resolved meanwhile (a repeat with the same key and action returns it).")
    def post(self, request, conflict_id):
        actor = actor_from_request(request)
        conflict = conflict_get(actor=actor, pk=conflict_id)
        tools.require_agent(actor)
        data = parse(AgentConflictResolveSerializer, request)
        row = conflict_resolve(actor=actor, conflict=conflict, action=data["action"],
                               merged_value=data.get("mergedValue"), idempotency_key=data["idempotencyKey"])
        return Response(s.ConflictDetailSerializer(Conflict.objects.select_related("link").get(pk=row.pk)).data)


class AgentLinkCommentView(APIView):
    @extend_schema(
        operation_id="agent_tools_connector_links_comment", parameters=[RUN_HEADER_PARAM],
        request=AgentLinkCommentSerializer, responses={202: AgentLinkCommentResultSerializer, **ERRORS},
        description="Agents only, on an issue assigned to you and checked out by your run. Queues the comment "
                    "on the external task through the outbound write engine (attributed, marked, posted once "
                    "per idempotency key). Governed by the link's sync mode and the postProgressComments "
                    "toggle: a refused write is 409 outbound_write_refused with details.reason.")
    def post(self, request, link_id):
        actor = actor_from_request(request)
        link = selectors.link_get(actor=actor, pk=link_id)
        tools.require_agent(actor)
        data = parse(AgentLinkCommentSerializer, request)
        effect, replayed = tools.link_comment_post(actor=actor, link=link, body=data["body"],
                                                   idempotency_key=data["idempotencyKey"])
        effect.replayed = replayed
        return Response(AgentLinkCommentResultSerializer(effect).data, status=status.HTTP_202_ACCEPTED)
