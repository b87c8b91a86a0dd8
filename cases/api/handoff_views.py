"""Handoff API. Thin: parse, call ``cases.handoffs``, serialize."""
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from issues.actors import actor_from_request
from issues.api.views import ERRORS, RUN_HEADER_PARAM, parse
from issues.exceptions import NotFound

from .. import handoffs, selectors
from . import handoff_serializers as s


def _handoff_response(actor, handoff, created):
    handoff = selectors.handoff_for_intervention(actor=actor, case_pk=handoff.case_id, handoff_pk=handoff.pk)
    return Response(s.HandoffSerializer(handoff).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class CompanyCaseHandoffsView(APIView):
    @extend_schema(request=s.HandoffRequestSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={201: s.HandoffSerializer, 200: s.HandoffSerializer, **ERRORS},
                   operation_id="company_case_handoffs_create",
                   description="Without caseId: a kickoff creating the case and its primary task (workflowId or "
                               "workflowDocumentText), or binding an existing issue as the primary task "
                               "(primaryTaskId). With caseId: hand the primary task to `to` (an agent id) "
                               "or record a closure intent (`to: \"done\"`). 200 with the same handoff on a "
                               "replay of the principal's idempotency key.")
    def post(self, request, company_id):
        actor = actor_from_request(request)
        company = selectors.cases_company(actor=actor, company_id=company_id)
        data = parse(s.HandoffRequestSerializer, request)
        workflow_id = data["workflowId"] if "workflowId" in data else handoffs.UNSET
        if "caseId" in data:
            case = selectors.case_get(actor=actor, pk=data["caseId"])
            if case.company_id != company.pk:
                raise NotFound("Case not found.")
            handoff, created = handoffs.handoff_request(
                actor=actor, company=company, case=case, to=data["to"], workflow_id=workflow_id,
                phase=data["phase"] if "phase" in data else handoffs.UNSET, note=data["note"],
                idempotency_key=data["idempotencyKey"])
        else:
            handoff, created = handoffs.handoff_kickoff(
                actor=actor, company=company, to=data["to"], case_type=data["type"], title=data["title"],
                kickoff=data["kickoff"], workflow_id=None if workflow_id is handoffs.UNSET else workflow_id,
                workflow_document_text=data.get("workflowDocumentText"), summary=data["summary"],
                fields=data["fields"], parent_id=data.get("parentCaseId"), project_id=data.get("projectId"),
                phase=data.get("phase") or "", note=data["note"], initial_documents=data["initialDocuments"],
                idempotency_key=data["idempotencyKey"], case_idempotency_key=data["caseIdempotencyKey"],
                primary_task_id=data.get("primaryTaskId"))
        return _handoff_response(actor, handoff, created)


class CaseHandoffsView(APIView):
    @extend_schema(responses={200: s.HandoffListSerializer, **ERRORS}, operation_id="case_handoffs_list",
                   description="Oldest first, with the captured workflow names and phases of every transition.")
    def get(self, request, case_id):
        rows = selectors.case_handoffs(actor=actor_from_request(request), case_pk=case_id)
        return Response({"items": s.HandoffSerializer(rows, many=True).data})


class CaseHandoffRetryView(APIView):
    @extend_schema(request=None, parameters=[RUN_HEADER_PARAM], responses={200: s.HandoffSerializer, **ERRORS},
                   operation_id="case_handoffs_retry",
                   description="Retry a held or failed handoff with its captured base revision; it stays held "
                               "while the workflow document differs from that base.")
    def post(self, request, case_id, handoff_id):
        actor = actor_from_request(request)
        selectors.case_get(actor=actor, pk=case_id)  # retry, unlike cancel, needs cases enabled
        handoff = selectors.handoff_for_intervention(actor=actor, case_pk=case_id, handoff_pk=handoff_id)
        return _handoff_response(actor, handoffs.handoff_retry(actor=actor, handoff=handoff), False)


class CaseHandoffCancelView(APIView):
    @extend_schema(request=s.HandoffCancelSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={200: s.HandoffSerializer, **ERRORS}, operation_id="case_handoffs_cancel",
                   description="Cancel an open handoff. Works even when cases are disabled for the company.")
    def post(self, request, case_id, handoff_id):
        actor = actor_from_request(request)
        handoff = selectors.handoff_for_intervention(actor=actor, case_pk=case_id, handoff_pk=handoff_id)
        data = parse(s.HandoffCancelSerializer, request) if request.data else {"reason": ""}
        return _handoff_response(actor, handoffs.handoff_cancel(actor=actor, handoff=handoff,
                                                                reason=data["reason"]), False)
