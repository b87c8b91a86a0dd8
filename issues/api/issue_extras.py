"""Issue extras of the upstream API (issue #14): child issues, company labels and the heartbeat context.

``DELETE /issues/{id}`` and the comment flags (``reopen``, ``interrupt``) live on the existing
views (issues/api/views.py); the rules are in issues/services/{issues,thread,labels}.py.
"""
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from issues import selectors
from issues.actors import actor_from_request
from issues.exceptions import InvalidInput
from issues.filtersets import ActivityFilterSet, IssueFilterSet, openapi_parameters
from issues.services import issues as issue_services
from issues.services import labels as label_services

from . import serializers as s
from .issue_extra_serializers import (ChildIssueCreateSerializer, HeartbeatContextSerializer, LabelCreateSerializer,
                                      LabelSerializer)
from .org_serializers import ActivityEntrySerializer
from .views import ERRORS, LIST_PARAMS, RUN_HEADER_PARAM, TASKS_ASSIGN_NOTE, issue_write_result, parse
from .wake import IssueRunSerializer

ISSUE_ACTIVITY_FILTERS = [p for p in openapi_parameters(ActivityFilterSet) if p.name not in ("entityType", "entityId")]
CHILD_FILTERS = [p for p in openapi_parameters(IssueFilterSet) if p.name not in ("parentId", "parentIssueId")]


class IssueActivityView(APIView):
    @extend_schema(parameters=[*ISSUE_ACTIVITY_FILTERS, *LIST_PARAMS],
                   responses={200: ActivityEntrySerializer(many=True), **ERRORS}, operation_id="issues_activity_list",
                   description="The audit rows about the issue (status changes, checkouts, comments, documents, "
                               "attachments), newest first.")
    def get(self, request, issue_id):
        issue = selectors.issue_row(actor=actor_from_request(request), pk=issue_id)
        return Response(ActivityEntrySerializer(selectors.issue_activity(issue=issue, params=request.query_params),
                                                many=True).data)


class IssueRunsView(APIView):
    @extend_schema(parameters=[OpenApiParameter("limit", {"type": "integer", "minimum": 1,
                                                          "maximum": selectors.RUN_LIST_MAX_LIMIT},
                                                description=f"How many (default {selectors.RUN_LIST_DEFAULT_LIMIT}).")],
                   responses={200: IssueRunSerializer(many=True), **ERRORS}, operation_id="issues_runs_list",
                   description="The runs woken for the issue and the runs that wrote to it, newest first.")
    def get(self, request, issue_id):
        issue = selectors.issue_row(actor=actor_from_request(request), pk=issue_id)
        return Response(IssueRunSerializer(selectors.issue_runs(issue=issue, params=request.query_params),
                                           many=True).data)


class IssueChildrenView(APIView):
    @extend_schema(parameters=[*CHILD_FILTERS, *LIST_PARAMS], responses={200: s.IssueSerializer(many=True), **ERRORS},
                   operation_id="issues_children_list",
                   description="The issue's direct children: the issue list's filters, order and paging.")
    def get(self, request, issue_id):
        actor = actor_from_request(request)
        issue = selectors.issue_get(actor=actor, pk=issue_id)
        children = selectors.issue_children(issue=issue, params=request.query_params, actor=actor)
        return Response(s.IssueSerializer(children, many=True).data)

    @extend_schema(request=ChildIssueCreateSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={201: s.IssueWriteResultSerializer, **ERRORS}, operation_id="issues_children_create",
                   description="Creates an issue under this one (the issue-create body without parentId). An "
                               "agent's tree stays two levels deep: a grandchild goes beside the requester "
                               f"(parentAdjusted). {TASKS_ASSIGN_NOTE}")
    def post(self, request, issue_id):
        actor = actor_from_request(request)
        parent = selectors.issue_row(actor=actor, pk=issue_id)
        company = actor.company(parent.company_id)
        data = parse(ChildIssueCreateSerializer, request)
        issue, adjustment = issue_services.issue_create(
            actor=actor, company=company, title=data["title"], description=data["description"],
            status=data.get("status"), priority=data["priority"], parent_id=parent.pk,
            project_id=data.get("projectId"), goal_id=data.get("goalId"),
            assignee_agent_id=data.get("assigneeAgentId"), block_parent_until_done=data["blockParentUntilDone"],
            execution_workspace_id=data.get("executionWorkspaceId"), workspace_strategy=data.get("workspaceStrategy"),
            inherit_workspace_from_id=data.get("inheritExecutionWorkspaceFromIssueId"),
            label_ids=data.get("labelIds"), blocked_by_ids=data.get("blockedByIssueIds"),
            assignee_user_id=data.get("assigneeUserId"), billing_code=data["billingCode"],
        )
        return issue_write_result(issue, adjustment, status.HTTP_201_CREATED)


class CompanyLabelsView(APIView):
    @extend_schema(parameters=LIST_PARAMS, responses={200: LabelSerializer(many=True), **ERRORS},
                   operation_id="company_labels_list")
    def get(self, request, company_id):
        company = actor_from_request(request).company(company_id)
        return Response(LabelSerializer(selectors.label_list(company=company, params=request.query_params),
                                        many=True).data)

    @extend_schema(request=LabelCreateSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={201: LabelSerializer, **ERRORS}, operation_id="company_labels_create",
                   description="A duplicate name (ignoring case) is a 409 label_exists.")
    def post(self, request, company_id):
        actor = actor_from_request(request)
        company = actor.company(company_id)
        data = parse(LabelCreateSerializer, request)
        label = label_services.label_create(actor=actor, company=company, name=data["name"], color=data["color"])
        return Response(LabelSerializer(label).data, status=status.HTTP_201_CREATED)


class LabelDetailView(APIView):
    @extend_schema(request=None, parameters=[RUN_HEADER_PARAM], responses={200: LabelSerializer, **ERRORS},
                   operation_id="labels_delete", description="Deletes the label (issues lose it); returns it.")
    def delete(self, request, label_id):
        actor = actor_from_request(request)
        label = selectors.label_get(actor=actor, pk=label_id)
        return Response(LabelSerializer(label_services.label_delete(actor=actor, label=label)).data)


class IssueCommentDetailView(APIView):
    @extend_schema(responses={200: s.CommentSerializer, **ERRORS}, operation_id="issues_comments_get",
                   description="One comment of this issue; another issue's comment is a 404.")
    def get(self, request, issue_id, comment_id):
        issue = selectors.issue_row(actor=actor_from_request(request), pk=issue_id)
        return Response(s.CommentSerializer(selectors.comment_get(issue=issue, pk=comment_id)).data)


MISSING_COMPANY = "Missing companyId in path. Use /api/companies/{companyId}/issues."  # upstream's words


class IssuesWithoutCompanyView(APIView):
    @extend_schema(responses=ERRORS, operation_id="issues_list_without_company",
                   description="Always a 400: issues are listed per company (GET /companies/{id}/issues).")
    def get(self, request):
        raise InvalidInput(MISSING_COMPANY, code="missing_company_id", details={"companyId": ["Required in the path."]})


WAKE_COMMENT_PARAM = OpenApiParameter("wakeCommentId", str,
                                      description="The comment that woke the agent (PAPERCLIP_WAKE_COMMENT_ID).")


class IssueHeartbeatContextView(APIView):
    @extend_schema(parameters=[WAKE_COMMENT_PARAM],
                   responses={200: HeartbeatContextSerializer, **ERRORS}, operation_id="issues_heartbeat_context",
                   description="Upstream's compact payload for the start of a wake: the issue with its "
                               "blockers, its ancestors, project, goal, the comment cursor, the wake comment "
                               "(only when it is this issue's) and the `continuation-summary` document.")
    def get(self, request, issue_id):
        context = selectors.heartbeat_context(actor=actor_from_request(request), pk=issue_id,
                                              wake_comment_id=request.query_params.get("wakeCommentId", "").strip())
        return Response(HeartbeatContextSerializer(context).data)
