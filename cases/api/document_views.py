"""Case-owned documents over REST: list, read, write (revisioned), revisions, and an operator's
quarantine/release. Thin: parse, call, serialize. 404 when the company's ``enable_cases`` is off."""
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from issues.actors import actor_from_request
from issues.api.document_visibility import DocumentQuarantineSerializer
from issues.api.serializers import DocumentSerializer, DocumentWriteSerializer
from issues.api.views import ERRORS, LIST_PARAMS, RUN_HEADER_PARAM, parse
from issues.services import document_visibility

from .. import documents, selectors

CASE_ID_PARAM = OpenApiParameter("case_id", str, OpenApiParameter.PATH, description="UUID or identifier (PREFIX-C<n>).")


class CaseDocumentSerializer(DocumentSerializer):
    """An issue document's shape, owned by a case: ``caseId`` instead of ``issueId`` (and without
    the legacy ``revisionId`` / ``revisionNumber`` aliases, which only issue documents ever had)."""
    issueId = None
    revisionId = None
    revisionNumber = None
    caseId = serializers.UUIDField(source="case_id")


class CaseDocumentSummarySerializer(CaseDocumentSerializer):
    body = None  # a list never carries bodies: read one document, or page it with read_case


class CaseDocumentRevisionSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    documentId = serializers.UUIDField(source="document_id")
    caseId = serializers.UUIDField(source="document.case_id")
    key = serializers.CharField(source="document.key")
    revisionNumber = serializers.IntegerField(source="number")
    title = serializers.CharField()
    body = serializers.CharField()
    authorType = serializers.CharField(source="author_type")
    authorAgentId = serializers.UUIDField(source="author_agent_id", allow_null=True)
    authorUserId = serializers.IntegerField(source="author_user_id", allow_null=True)
    runId = serializers.UUIDField(source="run_id", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")


def _case(request, case_id):
    actor = actor_from_request(request)
    return actor, selectors.case_get(actor=actor, pk=case_id)


class CaseDocumentsView(APIView):
    @extend_schema(parameters=[CASE_ID_PARAM], responses={200: CaseDocumentSummarySerializer(many=True), **ERRORS},
                   operation_id="cases_documents_list",
                   description="The case's own documents (key order, without bodies). A task's documents are "
                               "at `/api/issues/{id}/documents`.")
    def get(self, request, case_id):
        _, case = _case(request, case_id)
        return Response(CaseDocumentSummarySerializer(selectors.case_documents(case=case), many=True).data)


class CaseDocumentView(APIView):
    @extend_schema(parameters=[CASE_ID_PARAM], responses={200: CaseDocumentSerializer, **ERRORS},
                   operation_id="cases_documents_retrieve")
    def get(self, request, case_id, key):
        _, case = _case(request, case_id)
        return Response(CaseDocumentSerializer(selectors.case_document_get(case=case, key=key)).data)

    @extend_schema(request=DocumentWriteSerializer, parameters=[CASE_ID_PARAM, RUN_HEADER_PARAM],
                   responses={200: CaseDocumentSerializer, 201: CaseDocumentSerializer, **ERRORS},
                   operation_id="cases_documents_write",
                   description="Write a revision of the case's own document `key` (201 for the first). "
                               "`baseRevisionId` must be the latest revision (omitted for a new document); "
                               "otherwise 409 stale_revision with the current one. Board writers, or an agent "
                               "from a live run (the primary task's checkout run while it is in progress).")
    def put(self, request, case_id, key):
        actor, case = _case(request, case_id)
        data = parse(DocumentWriteSerializer, request)
        revision = documents.case_document_write(
            actor=actor, case=case, key=key, body=data["body"], title=data.get("title"),
            format=data.get("format"), base_revision_id=data.get("baseRevisionId"))
        code = status.HTTP_201_CREATED if revision.number == 1 else status.HTTP_200_OK
        return Response(CaseDocumentSerializer(selectors.case_document_get(case=case, key=key)).data, status=code)


class CaseDocumentRevisionsView(APIView):
    @extend_schema(parameters=[CASE_ID_PARAM, *LIST_PARAMS],
                   responses={200: CaseDocumentRevisionSerializer(many=True), **ERRORS},
                   operation_id="cases_documents_revisions",
                   description="Revisions (oldest first) of the case's own document `key`.")
    def get(self, request, case_id, key):
        _, case = _case(request, case_id)
        revisions = selectors.case_document_revisions(case=case, key=key, params=request.query_params)
        return Response(CaseDocumentRevisionSerializer(revisions, many=True).data)


class CaseDocumentQuarantineView(APIView):
    @extend_schema(request=DocumentQuarantineSerializer, parameters=[CASE_ID_PARAM],
                   responses={200: CaseDocumentSerializer, **ERRORS}, operation_id="cases_documents_quarantine",
                   description="Board only (write role): withhold the case document from agents' bounded page "
                               "reads; its revisions are kept. Idempotent. Audited as `document.quarantined`.")
    def post(self, request, case_id, key):
        actor, case = _case(request, case_id)
        data = parse(DocumentQuarantineSerializer, request)
        document = selectors.case_document_get(case=case, key=key)
        document_visibility.document_quarantine(actor=actor, document=document, reason=data.get("reason", ""))
        return Response(CaseDocumentSerializer(selectors.case_document_get(case=case, key=key)).data)


class CaseDocumentReleaseView(APIView):
    @extend_schema(request=None, parameters=[CASE_ID_PARAM], responses={200: CaseDocumentSerializer, **ERRORS},
                   operation_id="cases_documents_release",
                   description="Board only (write role): serve a quarantined case document to page reads again. "
                               "Idempotent. Audited as `document.released`.")
    def post(self, request, case_id, key):
        actor, case = _case(request, case_id)
        document_visibility.document_release(actor=actor, document=selectors.case_document_get(case=case, key=key))
        return Response(CaseDocumentSerializer(selectors.case_document_get(case=case, key=key)).data)
