"""Bounded paged reads, history and task links of cases. Thin: parse, call, serialize.
Every route answers 404 when the company's ``enable_cases`` flag is off."""
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from issues.actors import actor_from_request
from issues.api.views import ERRORS, LIST_PARAMS, RUN_HEADER_PARAM, parse
from issues.exceptions import InvalidInput

from .. import links, reading, selectors
from . import read_serializers as rs
from .serializers import CaseIssueLinkSerializer

CASE_ID_PARAM = OpenApiParameter("case_id", str, OpenApiParameter.PATH, description="UUID or identifier (PREFIX-C<n>).")


def _query(serializer_class, request):
    serializer = serializer_class(data=request.query_params)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


# --- paged reads (called from CaseDetailView.get / WorkflowDefinitionDetailView.get) -----------
def is_agent_read(request) -> bool:
    """True for ``agentRead=true``; read parameters without it are a 400 (never silently ignored)."""
    actor_from_request(request)  # 401 before any parameter error
    params = request.query_params
    raw = params.get("agentRead")
    if raw is not None and raw.lower() not in ("false", "0"):
        return True  # the serializer rejects values that are not booleans
    present = [name for name in rs.CaseReadQuerySerializer.READ_ONLY_PARAMS if name in params]
    if present:
        raise InvalidInput(details={name: ["Only with agentRead=true."] for name in present})
    return False


def case_agent_read(request, case_id) -> Response:
    """``GET /api/cases/{id}?agentRead=true``: see :func:`cases.reading.read_case`."""
    actor = actor_from_request(request)
    data = _query(rs.CaseReadQuerySerializer, request)
    params = reading.read_params(offset_bytes=data.get("offsetBytes"), limit_bytes=data.get("limitBytes"),
                                 snapshot=data.get("snapshot"), section=data.get("section"),
                                 document_key=data.get("documentKey"), document_issue_id=data.get("documentIssueId"))
    result = reading.read_case(actor=actor, pk=case_id, params=params)
    return Response(rs.CaseAgentReadSerializer(result).data)


def is_prompt_page(request) -> bool:
    return any(name in request.query_params for name in rs.WorkflowPromptQuerySerializer.PAGE_PARAMS)


def workflow_prompt_page(request, definition_id) -> Response:
    """``GET /api/workflows/{id}?offsetBytes=&limitBytes=&fingerprint=``: one prompt page."""
    actor = actor_from_request(request)
    data = _query(rs.WorkflowPromptQuerySerializer, request)
    page = reading.read_workflow_prompt(actor=actor, pk=definition_id, offset=data.get("offsetBytes") or 0,
                                        limit=data.get("limitBytes"), fingerprint=data.get("fingerprint"))
    return Response(rs.WorkflowPromptPageSerializer(page).data)


# --- history ---------------------------------------------------------------------------------
class CaseEventsView(APIView):
    @extend_schema(parameters=[CASE_ID_PARAM, *LIST_PARAMS], responses={200: rs.CaseEventPageSerializer, **ERRORS},
                   operation_id="cases_events_list",
                   description="The case's history, oldest first (created, then id); offset pagination.")
    def get(self, request, case_id):
        case = selectors.case_get(actor=actor_from_request(request), pk=case_id)
        return Response(rs.CaseEventPageSerializer(selectors.case_events(case=case, params=request.query_params)).data)


# --- task links ------------------------------------------------------------------------------
class CaseLinksView(APIView):
    @extend_schema(request=rs.CaseLinkCreateSerializer, parameters=[CASE_ID_PARAM, RUN_HEADER_PARAM],
                   responses={201: CaseIssueLinkSerializer, 200: CaseIssueLinkSerializer, **ERRORS},
                   operation_id="cases_links_create",
                   description="Link a task of the case's company as `work` or `reference`. 201 for a new link; "
                               "200 with the existing link when the pair is already linked with that role; 409 "
                               "case_link_exists when it is linked with another role.")
    def post(self, request, case_id):
        actor = actor_from_request(request)
        case = selectors.case_get(actor=actor, pk=case_id)
        data = parse(rs.CaseLinkCreateSerializer, request)
        link, created = links.case_link_issue(actor=actor, case=case, issue_id=data["issueId"], role=data["role"])
        return Response(CaseIssueLinkSerializer(link).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class CaseLinkDetailView(APIView):
    @extend_schema(parameters=[CASE_ID_PARAM, RUN_HEADER_PARAM,
                               OpenApiParameter("issue_id", OpenApiTypes.UUID, OpenApiParameter.PATH)],
                   responses={204: None, **ERRORS}, operation_id="cases_links_delete",
                   description="Remove a work/reference link (409 case_origin_link for the origin link).")
    def delete(self, request, case_id, issue_id):
        actor = actor_from_request(request)
        case = selectors.case_get(actor=actor, pk=case_id)
        links.case_unlink_issue(actor=actor, case=case, issue_id=issue_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class IssueCasesView(APIView):
    @extend_schema(parameters=[OpenApiParameter("issue_id", str, OpenApiParameter.PATH,
                                                description="UUID or identifier (PREFIX-<n>).")],
                   responses={200: rs.IssueCaseSerializer(many=True), **ERRORS}, operation_id="issues_cases_list",
                   description="Cases linked to the issue (any role), oldest link first.")
    def get(self, request, issue_id):
        rows = selectors.issue_cases(actor=actor_from_request(request), issue_id=issue_id)
        return Response(rs.IssueCaseSerializer(rows, many=True).data)
