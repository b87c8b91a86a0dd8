"""Approvals over the API (upstream Paperclip §5.3): agents and board users ask, board users decide.

Thin views: parse, call ``issues.services.approvals`` or a selector, serialize.
"""
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from issues import selectors
from issues.actors import actor_from_request
from issues.choices import ApprovalStatus
from issues.exceptions import InvalidInput
from issues.services import approval_comments as comment_services
from issues.services import approvals as approval_services

from . import approval_serializers as a
from . import serializers as s
from .agent_serializers import OkSerializer
from .views import ERRORS, LIST_PARAMS, RUN_HEADER_PARAM, parse

STATUS_PARAM = OpenApiParameter("status", {"type": "string", "enum": list(ApprovalStatus.values)},
                                description="Only approvals in this status.")


def approval_response(approval, code=status.HTTP_200_OK):
    return Response(a.ApprovalSerializer(approval).data, status=code)


class CompanyApprovalsView(APIView):
    @extend_schema(parameters=[STATUS_PARAM, *LIST_PARAMS], responses={200: a.ApprovalSerializer(many=True), **ERRORS},
                   operation_id="company_approvals_list")
    def get(self, request, company_id):
        company = actor_from_request(request).company(company_id)
        wanted = request.query_params.get("status") or None
        if wanted is not None and wanted not in ApprovalStatus.values:
            raise InvalidInput(details={"status": [f"Must be one of {', '.join(ApprovalStatus.values)}."]})
        limit, offset = selectors.list_window(request.query_params)
        approvals = selectors.approval_list(company=company, status=wanted)[offset: offset + limit]
        return Response(a.ApprovalSerializer(approvals, many=True).data)

    @extend_schema(request=a.ApprovalCreateSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={201: a.ApprovalSerializer, **ERRORS}, operation_id="company_approvals_create")
    def post(self, request, company_id):
        actor = actor_from_request(request)
        company = actor.company(company_id)
        data = parse(a.ApprovalCreateSerializer, request)
        approval = approval_services.approval_create(
            actor=actor, company=company, type=data["type"], payload=data["payload"], title=data.get("title"),
            requested_by_agent_id=data.get("requestedByAgentId"), issue_ids=data["issueIds"],
        )
        return approval_response(approval, status.HTTP_201_CREATED)


class ApprovalView(APIView):
    @extend_schema(responses={200: a.ApprovalSerializer, **ERRORS}, operation_id="approvals_retrieve")
    def get(self, request, approval_id):
        return approval_response(selectors.approval_get(actor=actor_from_request(request), pk=approval_id))


class ApprovalIssuesView(APIView):
    @extend_schema(responses={200: s.IssueSerializer(many=True), **ERRORS}, operation_id="approvals_issues")
    def get(self, request, approval_id):
        approval = selectors.approval_get(actor=actor_from_request(request), pk=approval_id)
        issues = approval.issues.select_related(*selectors.ISSUE_RELATED).order_by("priority_rank", "created_at")
        return Response(s.IssueSerializer(issues, many=True).data)


class ApprovalDecisionView(APIView):
    """Board only (403 ``board_only`` for agents, ``read_only_role`` for viewers)."""

    decision: str = ""

    def decide(self, request, approval_id):
        actor = actor_from_request(request)
        approval = selectors.approval_get(actor=actor, pk=approval_id)
        data = parse(a.ApprovalDecisionSerializer, request)
        approval = approval_services.approval_decide(actor=actor, approval=approval, status=self.decision,
                                                     note=data.get("decisionNote"))
        return approval_response(approval)


def decision_schema(operation_id: str, summary: str):
    # ``comment`` is accepted as an alias of ``decisionNote`` (decisionNote wins when both are given).
    return extend_schema(request=a.ApprovalDecisionSerializer, responses={200: a.ApprovalSerializer, **ERRORS},
                         operation_id=operation_id, summary=summary)


class ApprovalApproveView(ApprovalDecisionView):
    decision = ApprovalStatus.APPROVED

    @decision_schema("approvals_approve",
                     "Approve (from pending or revision_requested; an approved one is returned unchanged).")
    def post(self, request, approval_id):
        return self.decide(request, approval_id)


class ApprovalRejectView(ApprovalDecisionView):
    decision = ApprovalStatus.REJECTED

    @decision_schema("approvals_reject",
                     "Reject (from pending or revision_requested; a rejected one is returned unchanged).")
    def post(self, request, approval_id):
        return self.decide(request, approval_id)


class ApprovalRequestRevisionView(ApprovalDecisionView):
    decision = ApprovalStatus.REVISION_REQUESTED

    @decision_schema("approvals_request_revision", "Ask the requester for a revision (from pending only).")
    def post(self, request, approval_id):
        return self.decide(request, approval_id)


class ApprovalResubmitView(APIView):
    @extend_schema(request=a.ApprovalResubmitSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={200: a.ApprovalSerializer, **ERRORS}, operation_id="approvals_resubmit")
    def post(self, request, approval_id):
        actor = actor_from_request(request)
        approval = selectors.approval_get(actor=actor, pk=approval_id)
        data = parse(a.ApprovalResubmitSerializer, request)
        approval = approval_services.approval_resubmit(actor=actor, approval=approval, payload=data.get("payload"))
        return approval_response(approval)


class ApprovalCommentsView(APIView):
    """Board users and agents of the approval's company; an agent posts from a live run."""

    @extend_schema(parameters=LIST_PARAMS, responses={200: a.ApprovalCommentSerializer(many=True), **ERRORS},
                   operation_id="approvals_comments_list", summary="The approval's comments, oldest first.")
    def get(self, request, approval_id):
        approval = selectors.approval_get(actor=actor_from_request(request), pk=approval_id)
        comments = selectors.approval_comment_list(approval=approval, params=request.query_params)
        return Response(a.ApprovalCommentSerializer(comments, many=True).data)

    @extend_schema(request=a.ApprovalCommentCreateSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={201: a.ApprovalCommentSerializer, **ERRORS}, operation_id="approvals_comments_create")
    def post(self, request, approval_id):
        actor = actor_from_request(request)
        approval = selectors.approval_get(actor=actor, pk=approval_id)
        data = parse(a.ApprovalCommentCreateSerializer, request)
        comment = comment_services.approval_comment_add(actor=actor, approval=approval, body=data["body"])
        return Response(a.ApprovalCommentSerializer(comment).data, status=status.HTTP_201_CREATED)


LINK_RULE = ("Board users with a write role; agents with the CEO role or `canCreateAgents` (else 403 `Missing "
             "permission to link approvals`).")


class IssueApprovalsView(APIView):
    @extend_schema(responses={200: a.ApprovalSerializer(many=True), **ERRORS}, operation_id="issues_approvals_list",
                   description="The approvals linked to the issue, in the order they were linked.")
    def get(self, request, issue_id):
        issue = selectors.issue_get(actor=actor_from_request(request), pk=issue_id)
        return Response(a.ApprovalSerializer(selectors.issue_approvals(issue), many=True).data)

    @extend_schema(request=a.ApprovalLinkSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={201: a.ApprovalSerializer(many=True), **ERRORS}, operation_id="issues_approvals_link",
                   description="Link an approval of the issue's company (404 naming `approvalId` otherwise); "
                               "linking a linked one changes nothing. Answers the issue's approvals. " + LINK_RULE)
    def post(self, request, issue_id):
        actor = actor_from_request(request)
        issue = selectors.issue_get(actor=actor, pk=issue_id)
        data = parse(a.ApprovalLinkSerializer, request)
        approval_services.issue_approval_link(actor=actor, issue=issue, approval_id=data["approvalId"])
        return Response(a.ApprovalSerializer(selectors.issue_approvals(issue), many=True).data,
                        status=status.HTTP_201_CREATED)


class IssueApprovalLinkView(APIView):
    @extend_schema(request=None, parameters=[RUN_HEADER_PARAM], responses={200: OkSerializer, **ERRORS},
                   operation_id="issues_approvals_unlink",
                   description="Remove the link; an approval that is not linked changes nothing. " + LINK_RULE)
    def delete(self, request, issue_id, approval_id):
        actor = actor_from_request(request)
        issue = selectors.issue_get(actor=actor, pk=issue_id)
        approval_services.issue_approval_unlink(actor=actor, issue=issue, approval_id=approval_id)
        return Response(OkSerializer({"ok": True}).data)
