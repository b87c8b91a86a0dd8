"""The agent REST API (Heartbeat Protocol) and the board's use of the same endpoints.

Views are thin: parse and validate, call a selector or service, serialize.
"""
from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from issues import selectors
from issues.actors import RUN_HEADER, actor_from_request
from issues.adapters.result_line import RunReport
from issues.exceptions import Forbidden, InvalidInput
from issues.filtersets import IssueFilterSet, openapi_parameters
from issues.models import Agent, Interaction, Issue
from issues.services import checkout as checkout_services
from issues.services import companies as company_services
from issues.services import issues as issue_services
from issues.services import wakeups as wakeup_services
from issues.services import run_results
from issues.services import runs as run_services
from issues.services import thread as thread_services
from issues.services.agents import ensure_agent
from issues.services.lookups import company_object

from . import serializers as s
from .representation import represent, validated
from .org_serializers import CompanyCreateSerializer, CompanySerializer
from .agent_serializers import AgentMeSerializer, OkSerializer
from .issue_extra_serializers import IssueUpdateResultSerializer

ERRORS = {code: s.ErrorSerializer for code in (400, 401, 403, 404, 409, 422)}
# issues/services/agent_grants.py
TASKS_ASSIGN_NOTE = ("Naming an assignee (assigneeAgentId or assigneeUserId) needs tasks:assign: for an agent the "
                     "canAssignTasks grant, canCreateAgents or the CEO role, else 403 'Missing permission: "
                     "tasks:assign' (missing_permission) and nothing is written; board users with a write role "
                     "always assign.")
RUN_HEADER_PARAM = OpenApiParameter(RUN_HEADER, OpenApiTypes.UUID, OpenApiParameter.HEADER, required=False,
                                    description="Required on agent mutations: one of the calling agent's runs.")
LIST_PARAMS = [
    OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": settings.PAPERCLIP["API_LIST_MAX_LIMIT"]},
                     description=f"Page size (default {settings.PAPERCLIP['API_LIST_DEFAULT_LIMIT']}, "
                                 f"max {settings.PAPERCLIP['API_LIST_MAX_LIMIT']})."),
    OpenApiParameter("offset", {"type": "integer", "minimum": 0, "maximum": selectors.MAX_OFFSET},
                     description="Items to skip."),
]


def parse(serializer_class, request):
    return validated(serializer_class, request.data)


def issue_write_result(issue, adjustment, code=status.HTTP_200_OK):
    data = represent(s.IssueSerializer, issue)
    data["parentAdjusted"] = adjustment.as_dict() if adjustment else None
    return Response(data, status=code)


class AgentMeView(APIView):
    @extend_schema(responses={200: AgentMeSerializer, **ERRORS}, operation_id="agents_me",
                   description="The calling agent's record as GET /agents/{id} shows it (adapterConfig redacted), "
                               "with its company. A board credential is a 401 `Agent authentication required`.")
    def get(self, request):
        actor = actor_from_request(request)
        ensure_agent(actor)
        agent = Agent.objects.select_related("company", "reports_to").get(pk=actor.agent.pk)
        agent.chain_of_command = selectors.chain_of_command(agent)
        return Response(AgentMeSerializer(agent, context={"redact": True}).data)


class CompanyIssuesView(APIView):
    @extend_schema(
        parameters=[*openapi_parameters(IssueFilterSet), *LIST_PARAMS],
        responses={200: s.IssueSerializer(many=True), **ERRORS},
        operation_id="company_issues_list",
    )
    def get(self, request, company_id):
        company = actor_from_request(request).company(company_id)
        issues = selectors.issue_list(company=company, params=request.query_params, actor=actor_from_request(request))
        return Response(s.IssueSerializer(issues, many=True).data)

    @extend_schema(request=s.IssueCreateSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={201: s.IssueWriteResultSerializer, **ERRORS}, operation_id="company_issues_create",
                   description=f"{TASKS_ASSIGN_NOTE} An agent's tree stays two levels deep: a grandchild goes "
                               "beside the requester (parentAdjusted).")
    def post(self, request, company_id):
        actor = actor_from_request(request)
        company = actor.company(company_id)
        data = parse(s.IssueCreateSerializer, request)
        issue, adjustment = issue_services.issue_create(
            actor=actor, company=company, title=data["title"], description=data["description"],
            status=data.get("status"), priority=data["priority"], parent_id=data.get("parentId"),
            project_id=data.get("projectId"), goal_id=data.get("goalId"),
            assignee_agent_id=data.get("assigneeAgentId"), block_parent_until_done=data["blockParentUntilDone"],
            execution_workspace_id=data.get("executionWorkspaceId"), workspace_strategy=data.get("workspaceStrategy"),
            inherit_workspace_from_id=data.get("inheritExecutionWorkspaceFromIssueId"),
            label_ids=data.get("labelIds"), blocked_by_ids=data.get("blockedByIssueIds"),
            assignee_user_id=data.get("assigneeUserId"), billing_code=data["billingCode"],
        )
        return issue_write_result(issue, adjustment, status.HTTP_201_CREATED)


PATCH_FIELDS = {"title": "title", "description": "description", "status": "status", "priority": "priority",
                "parentId": "parent_id", "projectId": "project_id", "goalId": "goal_id",
                "assigneeAgentId": "assignee_agent_id", "assigneeUserId": "assignee_user_id", "labelIds": "label_ids",
                "blockedByIssueIds": "blocked_by_ids", "billingCode": "billing_code"}


class IssueDetailView(APIView):
    @extend_schema(responses={200: s.IssueDetailSerializer, **ERRORS}, operation_id="issues_retrieve")
    def get(self, request, issue_id):
        issue = selectors.issue_detail(actor=actor_from_request(request), pk=issue_id)
        return Response(s.IssueDetailSerializer(issue).data)

    @extend_schema(request=s.IssuePatchSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={200: IssueUpdateResultSerializer, **ERRORS}, operation_id="issues_update",
                   description=f"{TASKS_ASSIGN_NOTE} Changing the assignee needs it too, except an agent handing its "
                               "own issue back to the person who created it.")
    def patch(self, request, issue_id):
        actor = actor_from_request(request)
        issue = selectors.issue_get(actor=actor, pk=issue_id)
        data = parse(s.IssuePatchSerializer, request)
        changes = {PATCH_FIELDS[k]: v for k, v in data.items() if k in PATCH_FIELDS}
        issue, adjustment, comment = issue_services.issue_update(actor=actor, issue=issue, changes=changes,
                                                                 comment=data.get("comment"), reopen=data["reopen"],
                                                                 interrupt=data["interrupt"],
                                                                 attachment_ids=data.get("attachmentIds"))
        response = issue_write_result(issue, adjustment)
        response.data["comment"] = s.CommentSerializer(comment).data if comment else None
        return response

    @extend_schema(request=None, responses={200: s.IssueSerializer, **ERRORS}, operation_id="issues_delete",
                   description="Board only. Deletes the issue with its thread; children move to the top level. "
                               "A live run on the issue is a 409 issue_run_active (stop it first).")
    def delete(self, request, issue_id):
        actor = actor_from_request(request)
        issue = selectors.issue_row(actor=actor, pk=issue_id)
        return Response(s.IssueSerializer(issue_services.issue_delete(actor=actor, issue=issue)).data)


class IssueCheckoutView(APIView):
    @extend_schema(request=s.CheckoutSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={200: s.IssueSerializer, **ERRORS}, operation_id="issues_checkout")
    def post(self, request, issue_id):
        actor = actor_from_request(request)
        data = parse(s.CheckoutSerializer, request)
        # The claim itself is scoped to the caller's companies: another company's issue is a 404.
        issue, _ = checkout_services.issue_checkout(
            actor=actor, issue_ref=issue_id, agent_id=data.get("agentId"),
            expected_statuses=data.get("expectedStatuses"), run_header=request.headers.get(RUN_HEADER),
        )
        return Response(represent(s.IssueSerializer, issue))


class IssueReleaseView(APIView):
    @extend_schema(request=None, parameters=[RUN_HEADER_PARAM], responses={200: s.IssueSerializer, **ERRORS},
                   operation_id="issues_release")
    def post(self, request, issue_id):
        actor = actor_from_request(request)
        issue = selectors.issue_row(actor=actor, pk=issue_id)
        return Response(represent(s.IssueSerializer, checkout_services.issue_release(actor=actor, issue=issue)))


class IssueForceReleaseView(APIView):
    @extend_schema(request=None, responses={200: s.ForceReleaseResultSerializer, **ERRORS},
                   parameters=[OpenApiParameter("clearAssignee", bool, description="Also detach the agent assignee.")],
                   operation_id="issues_admin_force_release",
                   description="Board only: clear a stranded checkout and execution lock (the status stays; the "
                               "assignee too unless clearAssignee=true, which puts an in_progress issue back to "
                               "todo). Audited as issue.admin_force_release with "
                               "the lock it held. A live run that held the lock is not stopped: stop it with "
                               "POST /issues/{id}/run/stop.")
    def post(self, request, issue_id):
        actor = actor_from_request(request)
        issue = selectors.issue_row(actor=actor, pk=issue_id)
        clear = request.query_params.get("clearAssignee", "false").strip().lower()
        if clear not in ("true", "false"):
            raise InvalidInput(details={"clearAssignee": ["Must be true or false."]})
        issue, previous = checkout_services.issue_force_release(actor=actor, issue=issue,
                                                                clear_assignee=clear == "true")
        return Response(s.ForceReleaseResultSerializer({"issue": issue, "previous": previous}).data)


class IssueBlockersView(APIView):
    @extend_schema(request=s.BlockerSerializer, responses={201: s.IssueRefSerializer(many=True), **ERRORS},
                   parameters=[RUN_HEADER_PARAM], operation_id="issues_blockers_add")
    def post(self, request, issue_id):
        actor = actor_from_request(request)
        issue = selectors.issue_get(actor=actor, pk=issue_id)
        data = parse(s.BlockerSerializer, request)
        blocker = company_object(Issue, issue.company_id, data["blockerId"], "blockerId")
        issue_services.relation_add(actor=actor, blocker=blocker, blocked=issue)
        return Response(s.IssueRefSerializer(selectors.open_blockers(issue), many=True).data, status=201)


class IssueCommentsView(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("after", OpenApiTypes.UUID, description="Return comments after this one."),
                    OpenApiParameter("afterCommentId", OpenApiTypes.UUID, description="Upstream's alias of after."),
                    OpenApiParameter("order", OpenApiTypes.STR,
                                     description="`asc` for oldest first; anything else is newest first."),
                    OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": selectors.MAX_OFFSET},
                                     description=f"At most this many (above {selectors.COMMENT_PAGE_MAX} is "
                                                 f"clamped); omitted: every comment.")],
        responses={200: s.CommentSerializer(many=True), **ERRORS}, operation_id="issues_comments_list",
    )
    def get(self, request, issue_id):
        issue = selectors.issue_get(actor=actor_from_request(request), pk=issue_id)
        comments = selectors.comment_list(issue=issue, params=request.query_params)
        return Response(s.CommentSerializer(comments, many=True).data)

    @extend_schema(request=s.CommentCreateSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={201: s.CommentSerializer, **ERRORS}, operation_id="issues_comments_create")
    def post(self, request, issue_id):
        actor = actor_from_request(request)
        issue = selectors.issue_get(actor=actor, pk=issue_id)
        data = parse(s.CommentCreateSerializer, request)
        comment = thread_services.comment_create(actor=actor, issue=issue, body=data["body"], reopen=data["reopen"],
                                                 interrupt=data["interrupt"],
                                                 attachment_ids=data.get("attachmentIds"))
        return Response(s.CommentSerializer(comment).data, status=status.HTTP_201_CREATED)


class IssueDocumentsView(APIView):
    @extend_schema(responses={200: s.DocumentSerializer(many=True), **ERRORS}, operation_id="issues_documents_list")
    def get(self, request, issue_id):
        issue = selectors.issue_get(actor=actor_from_request(request), pk=issue_id)
        return Response(s.DocumentSerializer(selectors.document_list(issue=issue), many=True).data)


class IssueDocumentView(APIView):
    @extend_schema(responses={200: s.DocumentSerializer, **ERRORS}, operation_id="issues_documents_retrieve")
    def get(self, request, issue_id, key):
        issue = selectors.issue_get(actor=actor_from_request(request), pk=issue_id)
        return Response(s.DocumentSerializer(selectors.document_get(issue=issue, key=key)).data)

    @extend_schema(request=s.IssueDocumentWriteSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={200: s.DocumentSerializer, 201: s.DocumentSerializer, **ERRORS},
                   operation_id="issues_documents_write")
    def put(self, request, issue_id, key):
        actor = actor_from_request(request)
        issue = selectors.issue_get(actor=actor, pk=issue_id)
        data = parse(s.IssueDocumentWriteSerializer, request)
        revision = thread_services.document_write(
            actor=actor, issue=issue, key=key, body=data["body"], title=data.get("title"),
            format=data.get("format"), base_revision_id=data.get("baseRevisionId"),
            change_summary=data.get("changeSummary", ""),
        )
        document = selectors.document_get(issue=issue, key=key)
        code = status.HTTP_201_CREATED if revision.number == 1 else status.HTTP_200_OK
        return Response(s.DocumentSerializer(document).data, status=code)

    @extend_schema(request=None, responses={200: OkSerializer, **ERRORS}, operation_id="issues_documents_delete",
                   description="Board only: deletes the document with all its revisions (`{ok: true}`). 409 "
                               "`document_delete_restricted` while an interaction is bound to one of its revisions.")
    def delete(self, request, issue_id, key):
        actor = actor_from_request(request)
        thread_services.document_delete(actor=actor, issue=selectors.issue_row(actor=actor, pk=issue_id), key=key)
        return Response(OkSerializer({"ok": True}).data)


class IssueDocumentRevisionsView(APIView):
    @extend_schema(responses={200: s.RevisionSerializer(many=True), **ERRORS},
                   operation_id="issues_documents_revisions")
    def get(self, request, issue_id, key):
        issue = selectors.issue_get(actor=actor_from_request(request), pk=issue_id)
        document = selectors.document_get(issue=issue, key=key)
        return Response(s.RevisionSerializer(document.revisions.order_by("number"), many=True).data)


class IssueDocumentRestoreView(APIView):
    @extend_schema(request=None, parameters=[RUN_HEADER_PARAM], responses={200: s.DocumentSerializer, **ERRORS},
                   operation_id="issues_documents_restore",
                   description="A new latest revision with that revision's title and body (history is kept); "
                               "the same writers and fences as PUT. 404 naming revisionId for another document's "
                               "revision.")
    def post(self, request, issue_id, key, revision_id):
        actor = actor_from_request(request)
        issue = selectors.issue_get(actor=actor, pk=issue_id)
        thread_services.document_restore(actor=actor, issue=issue, key=key, revision_id=revision_id)
        return Response(s.DocumentSerializer(selectors.document_get(issue=issue, key=key)).data)


class IssueInteractionsView(APIView):
    @extend_schema(responses={200: s.InteractionSerializer(many=True), **ERRORS},
                   operation_id="issues_interactions_list")
    def get(self, request, issue_id):
        issue = selectors.issue_get(actor=actor_from_request(request), pk=issue_id)
        return Response(s.InteractionSerializer(issue.interactions.order_by("created_at"), many=True).data)

    @extend_schema(request=s.InteractionCreateSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={201: s.InteractionSerializer, **ERRORS}, operation_id="issues_interactions_create")
    def post(self, request, issue_id):
        actor = actor_from_request(request)
        issue = selectors.issue_get(actor=actor, pk=issue_id)
        data = parse(s.InteractionCreateSerializer, request)
        interaction = thread_services.interaction_create(
            actor=actor, issue=issue, kind=data["kind"], title=data["title"], body=data["body"],
            payload=data["payload"], document_key=data.get("documentKey"),
            document_revision_id=data.get("documentRevisionId"),
        )
        return Response(s.InteractionSerializer(interaction).data, status=status.HTTP_201_CREATED)


class InteractionRespondView(APIView):
    @extend_schema(request=s.InteractionRespondSerializer, responses={200: s.InteractionSerializer, **ERRORS},
                   operation_id="interactions_respond")
    def post(self, request, interaction_id):
        actor = actor_from_request(request)
        interaction = selectors.scoped_get(Interaction.objects.all(), actor, interaction_id, "Interaction")
        data = parse(s.InteractionRespondSerializer, request)
        interaction = thread_services.interaction_respond(actor=actor, interaction=interaction,
                                                          status=data["status"], response=data["response"])
        return Response(s.InteractionSerializer(interaction).data)


class AgentWakeupView(APIView):
    @extend_schema(request=s.WakeupSerializer, responses={201: s.WakeupResultSerializer, **ERRORS},
                   operation_id="agents_wakeup")
    def post(self, request, agent_id):
        actor = actor_from_request(request)
        agent = selectors.scoped_get(Agent.objects.all(), actor, agent_id, "Agent")
        data = parse(s.WakeupSerializer, request)
        issue = company_object(Issue, agent.company_id, data.get("issueId"), "issueId")
        wake = wakeup_services.agent_wakeup_request(
            actor=actor, agent=agent, source=data["source"], reason=data["reason"], issue=issue,
            idempotency_key=data.get("idempotencyKey"), comment_ids=[str(c) for c in data["commentIds"]],
            trigger_detail=data.get("triggerDetail"), payload=data.get("payload"),
            force_fresh_session=data["forceFreshSession"],
        )
        if wake.run_id is not None:
            wake.run = selectors.run_with_pending_wakes(wake.run)
        return Response(s.WakeupResultSerializer(wake).data, status=status.HTTP_201_CREATED)


class RunHeartbeatView(APIView):
    @extend_schema(request=s.RunHeartbeatSerializer, responses={200: s.RunSerializer, **ERRORS},
                   operation_id="runs_heartbeat",
                   description="Keeps the run alive. With `final: true` it also reports the run's result "
                               "(`status`, `finalState`, `prUrl`, `summary`) and ends the run: succeeded, or "
                               "failed for `failed`/`aborted` (a process-adapter run ends when its process "
                               "exits). The result fields without `final` are a 400; an ended run is a 409.")
    def post(self, request, run_id):
        actor = actor_from_request(request)
        run = selectors.run_get(actor=actor, pk=run_id)
        data = parse(s.RunHeartbeatSerializer, request)
        run = run_services.run_heartbeat(actor=actor, run=run, liveness=data.get("liveness"),
                                         reason=data["livenessReason"], usage=data.get("usage"))
        if data["final"] and run.is_live:  # (a budget stop may have just ended it)
            report = RunReport(status=data["status"], final_state=data["finalState"], pr_url=data["prUrl"],
                               summary=data["summary"], liveness=data.get("liveness") or "",
                               liveness_reason=data["livenessReason"])
            run = run_results.run_report_final(actor=actor, run=run, report=report)
        return Response(s.RunSerializer(run).data)


class RunEventsView(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("after", {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
                                     description="Return events after this seq."),
                    *LIST_PARAMS],
        responses={200: s.RunEventSerializer(many=True), **ERRORS}, operation_id="runs_events",
    )
    def get(self, request, run_id):
        run = selectors.run_get(actor=actor_from_request(request), pk=run_id)
        return Response(s.RunEventSerializer(selectors.run_events(run=run, params=request.query_params),
                                             many=True).data)


class IssueRunStopView(APIView):
    @extend_schema(request=None, parameters=[RUN_HEADER_PARAM], responses={200: s.RunSerializer(many=True), **ERRORS},
                   operation_id="issues_run_stop")
    def post(self, request, issue_id):
        actor = actor_from_request(request)
        issue = selectors.issue_row(actor=actor, pk=issue_id)
        return Response(s.RunSerializer(run_services.issue_run_stop(actor=actor, issue=issue), many=True).data)


class RunDetailView(APIView):
    @extend_schema(responses={200: s.RunDetailSerializer, **ERRORS}, operation_id="runs_retrieve")
    def get(self, request, run_id):
        run = selectors.run_get(actor=actor_from_request(request), pk=run_id)
        return Response(s.RunDetailSerializer(selectors.run_with_pending_wakes(run)).data)


class CompanyListView(APIView):
    @extend_schema(responses={200: CompanySerializer(many=True), **ERRORS}, operation_id="companies_list",
                   description="Board only (upstream): the caller's companies, newest first by name.")
    def get(self, request):
        from issues.models import Company

        actor = actor_from_request(request)
        actor.ensure_board()
        return Response(CompanySerializer(Company.objects.filter(pk__in=actor.company_ids), many=True).data)

    @extend_schema(request=CompanyCreateSerializer, responses={201: CompanySerializer, **ERRORS},
                   operation_id="companies_create",
                   description="Instance admins (staff users) only, as upstream (403 `Instance admin required`); "
                               "the creator becomes the company's owner. A taken issuePrefix is a 409 prefix_taken.")
    def post(self, request):
        data = parse(CompanyCreateSerializer, request)
        company = company_services.company_found(
            actor=actor_from_request(request), name=data["name"], description=data.get("description") or "",
            budget_monthly_cents=data["budgetMonthlyCents"], issue_prefix=data.get("issuePrefix"))
        return Response(CompanySerializer(company).data, status=status.HTTP_201_CREATED)


class HealthView(APIView):
    """Host health for operators (staff): database, run queue, workspace disk use against its cap."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT, **ERRORS}, operation_id="health")
    def get(self, request):
        actor = actor_from_request(request)
        if not (actor.is_board and actor.user.is_staff):
            raise Forbidden("Host health is for staff users.", code="staff_only")
        return Response(selectors.host_health())
