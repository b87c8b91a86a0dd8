"""Agents and runs over the API, upstream-compatible (paperclip-api.md §5.1): the company's
agents, create / hire (agent-hires) / update / delete / permissions, pause / resume / terminate, keys,
the on-demand heartbeat, the agent's inbox-lite, and the board's run controls.

Thin views: parse, call a selector or ``issues.services.agents`` / ``runs``, serialize. Board users
see adapter configurations whole; agents see them redacted.
"""
from django.http import JsonResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, PolymorphicProxySerializer, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from issues import selectors
from issues.actors import actor_from_request
from issues.filtersets import AgentFilterSet, openapi_parameters
from issues.models import Agent
from issues.services import agents as agent_services
from issues.services import runs as run_services
from issues.services.agent_hires import agent_hire
from issues.services.companies import agent_api_key_create, agent_create
from issues.services.lookups import company_object

from . import agent_serializers as a
from .serializers import RunSerializer
from .views import ERRORS, LIST_PARAMS, RUN_HEADER_PARAM, parse
from .wake import LiveRunSerializer

EVENT_PARAMS = [
    OpenApiParameter("afterSeq", {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
                     description="Return events after this seq."),
    OpenApiParameter("limit", LIST_PARAMS[0].type, description=LIST_PARAMS[0].description),
]
# The body is a run (Run's fields with LiveRun's agentName and adapterType) or null; spectacular has no
# nullable response serializer, so the schema is written out over the two components.
ACTIVE_RUN_OR_NULL = {"allOf": [{"$ref": "#/components/schemas/Run"}, {"$ref": "#/components/schemas/LiveRun"}],
                      "nullable": True}
INVOKE_RESULT = PolymorphicProxySerializer(
    component_name="HeartbeatInvokeResult", serializers=[a.InvokedRunSerializer, a.InvokeSkippedSerializer],
    resource_type_field_name=None)


def new_agent_fields(company, data) -> dict:
    """A parsed AgentCreateSerializer body as ``agent_create``'s arguments (the manager resolved in the company)."""
    return dict(name=data["name"], role=data["role"], title=data["title"],
                reports_to=company_object(Agent, company.pk, data.get("reportsTo"), "reportsTo"),
                capabilities=data["capabilities"], adapter_type=data["adapterType"],
                adapter_config=data["adapterConfig"], runtime_config=data["runtimeConfig"],
                budget_monthly_cents=data["budgetMonthlyCents"], permissions=data.get("permissions"),
                icon=data["icon"], metadata=data["metadata"])


def agent_response(actor, agent, serializer=a.AgentRecordSerializer, code=status.HTTP_200_OK):
    return Response(serializer(agent, context={"redact": not actor.is_board}).data, status=code)


class CompanyAgentsView(APIView):
    @extend_schema(parameters=[*openapi_parameters(AgentFilterSet), *LIST_PARAMS],
                   responses={200: a.AgentRecordSerializer(many=True), **ERRORS}, operation_id="company_agents_list",
                   description="The company's agents by name (upstream bare array).")
    def get(self, request, company_id):
        actor = actor_from_request(request)
        agents = selectors.agent_list(company=actor.company(company_id), params=request.query_params)
        return Response(a.AgentRecordSerializer(agents, many=True, context={"redact": not actor.is_board}).data)

    @extend_schema(request=a.AgentCreateSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={201: a.AgentRecordSerializer, **ERRORS}, operation_id="company_agents_create",
                   description="Board users; an agent only with `permissions.canCreateAgents` (else 403 "
                               "`Missing permission: agents:create`). `permissions` is for board users.")
    def post(self, request, company_id):
        actor = actor_from_request(request)
        company = actor.company(company_id)
        data = parse(a.AgentCreateSerializer, request)
        agent = agent_create(actor=actor, company=company, **new_agent_fields(company, data))
        return agent_response(actor, agent, code=status.HTTP_201_CREATED)


class CompanyOrgView(APIView):
    @extend_schema(responses={200: a.OrgNodeSerializer(many=True), **ERRORS}, operation_id="company_org",
                   description="Upstream's lean org chart: the company's agents but the terminated, nested by "
                               "`reportsTo` (`{id, name, role, status, reports}`), by name; an agent whose "
                               "manager is terminated is a root.")
    def get(self, request, company_id):
        company = actor_from_request(request).company(company_id)
        return Response(selectors.org_tree(company=company))


class CompanyAgentHiresView(APIView):
    @extend_schema(request=a.AgentHireSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={201: a.AgentHireResultSerializer, **ERRORS}, operation_id="company_agent_hires_create",
                   description="Hire an agent: who may create agents may hire (board users; an agent with "
                               "`permissions.canCreateAgents`, else 403 `Missing permission: agents:create`). When "
                               "the company's `requireBoardApprovalForNewAgents` is on, the agent is created "
                               "`pending_approval` (its keys do not authenticate, work cannot be assigned to it: "
                               "409 `Cannot assign work to pending approval agents`, nothing wakes it) with a "
                               "pending `hire_agent` approval whose payload is the draft and `agentId`, linked to "
                               "`sourceIssueId`/`sourceIssueIds`; approving it makes the agent `idle`, rejecting "
                               "it terminates the agent. Otherwise the agent is created `idle` and `approval` is "
                               "null. 201 `{agent, approval}`.")
    def post(self, request, company_id):
        actor = actor_from_request(request)
        company = actor.company(company_id)
        data = parse(a.AgentHireSerializer, request)
        agent, approval = agent_hire(actor=actor, company=company, source_issue_ids=data["sourceIssueIds"],
                                     **new_agent_fields(company, data))
        body = a.AgentHireResultSerializer({"agent": agent, "approval": approval},
                                           context={"redact": not actor.is_board}).data
        return Response(body, status=status.HTTP_201_CREATED)


class AgentDetailView(APIView):
    @extend_schema(responses={200: a.AgentDetailSerializer, **ERRORS}, operation_id="agents_retrieve")
    def get(self, request, agent_id):
        actor = actor_from_request(request)
        return agent_response(actor, selectors.agent_detail(actor=actor, pk=agent_id), a.AgentDetailSerializer)

    @extend_schema(request=a.AgentPatchSerializer, responses={200: a.AgentRecordSerializer, **ERRORS},
                   operation_id="agents_update",
                   description="Board only. `permissions` is a 422 here: use PATCH /agents/{id}/permissions.")
    def patch(self, request, agent_id):
        actor = actor_from_request(request)
        agent = selectors.agent_get(actor=actor, pk=agent_id)
        changes = parse(a.AgentPatchSerializer, request)
        if "reportsTo" in changes:
            changes["reportsTo"] = company_object(Agent, agent.company_id, changes["reportsTo"], "reportsTo")
        return agent_response(actor, agent_services.agent_update(actor=actor, agent=agent, changes=changes))

    @extend_schema(request=None, responses={200: a.OkSerializer, **ERRORS}, operation_id="agents_destroy",
                   description="Board only. Purge the agent with its runs, wakes, keys and cost events (its "
                               "issues stay, unassigned). 409 `agent_case_history_retained` while case "
                               "handoffs name it (terminate it instead: the handoffs keep naming it); 409 "
                               "`agent_run_active` while it has a live run.")
    def delete(self, request, agent_id):
        actor = actor_from_request(request)
        agent = selectors.agent_get(actor=actor, pk=agent_id)  # another company's agent: 404 for everyone
        agent_services.agent_delete(actor=actor, agent=agent)
        return Response(a.OkSerializer({"ok": True}).data)


class AgentPermissionsView(APIView):
    @extend_schema(request=a.AgentPermissionsInputSerializer, responses={200: a.AgentRecordSerializer, **ERRORS},
                   operation_id="agents_permissions_update", description="Board only.")
    def patch(self, request, agent_id):
        actor = actor_from_request(request)
        agent = selectors.agent_get(actor=actor, pk=agent_id)
        values = parse(a.AgentPermissionsInputSerializer, request)
        return agent_response(actor, agent_services.agent_permissions_update(actor=actor, agent=agent, values=values))


class AgentLifecycleView(APIView):
    """Board only; the answer is the agent."""

    def act(self, actor, agent):
        raise NotImplementedError

    def post(self, request, agent_id):
        actor = actor_from_request(request)
        agent = selectors.agent_get(actor=actor, pk=agent_id)
        return agent_response(actor, self.act(actor, agent))


def lifecycle_schema(operation_id: str, description: str):
    return extend_schema(request=None, responses={200: a.AgentRecordSerializer, **ERRORS},
                         operation_id=operation_id, description=description)


class AgentPauseView(AgentLifecycleView):
    def act(self, actor, agent):
        return agent_services.agent_pause(actor=actor, agent=agent, stop_runs=True)

    @lifecycle_schema("agents_pause", "Board only. No new runs; the agent's live runs are cancelled.")
    def post(self, request, agent_id):
        return super().post(request, agent_id)


class AgentResumeView(AgentLifecycleView):
    def act(self, actor, agent):
        return agent_services.agent_resume(actor=actor, agent=agent, strict=False)

    @lifecycle_schema("agents_resume", "Board only. Back to idle (from paused or error); a terminated agent is a 409, "
                                       "and so is an agent of a paused, archived or over-budget company "
                                       "(company_stopped: it resumes with its company).")
    def post(self, request, agent_id):
        return super().post(request, agent_id)


class AgentTerminateView(AgentLifecycleView):
    def act(self, actor, agent):
        return agent_services.agent_terminate(actor=actor, agent=agent)

    @lifecycle_schema("agents_terminate", "Board only, final: live runs cancelled, every key revoked.")
    def post(self, request, agent_id):
        return super().post(request, agent_id)


class AgentKeysView(APIView):
    @extend_schema(parameters=LIST_PARAMS, responses={200: a.AgentKeySerializer(many=True), **ERRORS},
                   operation_id="agents_keys_list",
                   description="Board only. The agent's long-lived keys, revoked ones included, newest first; "
                               "never the token.")
    def get(self, request, agent_id):
        actor = actor_from_request(request)
        agent = selectors.agent_get(actor=actor, pk=agent_id)  # another company's agent: 404 for everyone
        actor.ensure_board()
        return Response(a.AgentKeySerializer(selectors.agent_key_list(agent=agent, params=request.query_params),
                                             many=True).data)

    @extend_schema(request=a.AgentKeyCreateSerializer, responses={201: a.AgentKeyCreatedSerializer, **ERRORS},
                   operation_id="agents_keys_create", description="Board only. The token is shown this once.")
    def post(self, request, agent_id):
        actor = actor_from_request(request)
        agent = selectors.agent_get(actor=actor, pk=agent_id)
        data = parse(a.AgentKeyCreateSerializer, request)
        key, raw = agent_api_key_create(agent=agent, name=data["name"], actor=actor)
        body = {"id": key.pk, "name": key.name, "token": raw, "created_at": key.created_at}
        return Response(a.AgentKeyCreatedSerializer(body).data, status=status.HTTP_201_CREATED)


class AgentKeyView(APIView):
    @extend_schema(request=None, responses={200: a.OkSerializer, **ERRORS}, operation_id="agents_keys_revoke",
                   description="Board only. Revoke one of the agent's keys (its requests are 401 from now); "
                               "another agent's key is a 404 `Key not found`.")
    def delete(self, request, agent_id, key_id):
        actor = actor_from_request(request)
        agent = selectors.agent_get(actor=actor, pk=agent_id)
        agent_services.agent_key_revoke(actor=actor, agent=agent, key_id=key_id)
        return Response(a.OkSerializer({"ok": True}).data)


class AgentHeartbeatInvokeView(APIView):
    @extend_schema(request=None, responses={202: INVOKE_RESULT, **ERRORS}, operation_id="agents_heartbeat_invoke",
                   description="An on-demand wake (the same service as /wakeup): 202 with the run it started or "
                               "joined, or 202 `{status: \"skipped\", reason}` (paused, over budget, ...). An "
                               "agent invokes only itself.")
    def post(self, request, agent_id):
        actor = actor_from_request(request)
        agent = selectors.agent_get(actor=actor, pk=agent_id)
        wake = agent_services.agent_heartbeat_invoke(actor=actor, agent=agent)
        if wake.run_id is None:
            body = {"status": "skipped", "reason": wake.skip_reason or wake.status, "wakeupRequestId": wake.pk}
            return Response(a.InvokeSkippedSerializer(body).data, status=status.HTTP_202_ACCEPTED)
        run = selectors.run_with_pending_wakes(wake.run)
        return Response({**RunSerializer(run).data, "wakeupRequestId": str(wake.pk)},
                        status=status.HTTP_202_ACCEPTED)


class AgentInboxLiteView(APIView):
    @extend_schema(parameters=LIST_PARAMS, responses={200: a.InboxLiteItemSerializer(many=True), **ERRORS},
                   operation_id="agents_me_inbox_lite",
                   description="The calling agent's issues in todo, in_progress, in_review or blocked: most "
                               "urgent first, then most recently updated; `activeRun` is the live run holding "
                               "the issue.")
    def get(self, request):
        actor = actor_from_request(request)
        agent_services.ensure_agent(actor)
        issues = selectors.agent_inbox_lite(agent=actor.agent, params=request.query_params)
        return Response(a.InboxLiteItemSerializer(issues, many=True).data)


class AgentMineInboxView(APIView):
    @extend_schema(parameters=[OpenApiParameter("userId", OpenApiTypes.INT, required=True,
                                                description="A board member of the agent's company."),
                               *LIST_PARAMS],
                   responses={200: a.MineInboxItemSerializer(many=True), **ERRORS},
                   operation_id="agents_me_inbox_mine",
                   description="A board member's Mine inbox, for the calling agent: the issues the member created, "
                               "was assigned or commented on, with the issue list's filters (`status` defaults to "
                               f"`{selectors.MINE_STATUSES}`), order and paging; each with `myLastTouchAt`, "
                               "`lastExternalCommentAt` and `isUnreadForMe`. 400 without `userId`; 404 naming it "
                               "for anyone who is not a member of the company.")
    def get(self, request):
        actor = actor_from_request(request)
        agent_services.ensure_agent(actor)
        issues = selectors.agent_mine_inbox(agent=actor.agent, params=request.query_params)
        return Response(a.MineInboxItemSerializer(issues, many=True).data)


class HeartbeatRunCancelView(APIView):
    @extend_schema(request=None, responses={200: RunSerializer, **ERRORS}, operation_id="heartbeat_runs_cancel",
                   description="Board only. A queued run (or one with no process here) is cancelled now; a "
                               "running process is stopped by its adapter (`stopRequested` is true until it "
                               "ends). An ended run is returned unchanged.")
    def post(self, request, run_id):
        actor = actor_from_request(request)
        run = selectors.heartbeat_run_get(actor=actor, pk=run_id)
        return Response(RunSerializer(run_services.run_cancel(actor=actor, run=run)).data)


class HeartbeatRunEventsView(APIView):
    @extend_schema(parameters=EVENT_PARAMS, responses={200: a.HeartbeatRunEventSerializer(many=True), **ERRORS},
                   operation_id="heartbeat_runs_events",
                   description="The run's events after `afterSeq` (upstream's name for /runs/{id}/events?after=).")
    def get(self, request, run_id):
        run = selectors.run_get(actor=actor_from_request(request), pk=run_id)
        params = {"limit": request.query_params["limit"]} if "limit" in request.query_params else {}
        if request.query_params.get("afterSeq") is not None:
            params["after"] = selectors.bounded_int(request.query_params["afterSeq"], "afterSeq", maximum=2**63 - 1)
        return Response(a.HeartbeatRunEventSerializer(selectors.run_events(run=run, params=params), many=True).data)


class HeartbeatRunIssuesView(APIView):
    @extend_schema(responses={200: a.RunIssueSerializer(many=True), **ERRORS}, operation_id="heartbeat_runs_issues",
                   description="Issues the run checked out, commented on or changed, and the issue it was woken "
                               "for. An unknown run is a 404 (upstream answers []), as another company's is.")
    def get(self, request, run_id):
        run = selectors.heartbeat_run_get(actor=actor_from_request(request), pk=run_id)
        return Response(a.RunIssueSerializer(selectors.run_touched_issues(run=run), many=True).data)


class IssueLiveRunsView(APIView):
    @extend_schema(responses={200: LiveRunSerializer(many=True), **ERRORS}, operation_id="issues_live_runs",
                   description="The issue's queued and running runs, newest first.")
    def get(self, request, issue_id):
        issue = selectors.issue_row(actor=actor_from_request(request), pk=issue_id)
        return Response(LiveRunSerializer(selectors.issue_live_runs(issue=issue), many=True).data)


class IssueActiveRunView(APIView):
    @extend_schema(responses={200: OpenApiResponse(ACTIVE_RUN_OR_NULL, description="The run, or null."), **ERRORS},
                   operation_id="issues_active_run",
                   description="The run holding the issue's execution lock (queued or running), else its newest "
                               "running run, else `null`.")
    def get(self, request, issue_id):
        issue = selectors.issue_row(actor=actor_from_request(request), pk=issue_id)
        run = selectors.issue_active_run(issue=issue)
        if run is None:
            return JsonResponse(None, safe=False)
        return Response(a.ActiveRunSerializer(run).data)
