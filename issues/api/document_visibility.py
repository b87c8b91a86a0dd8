"""Operator quarantine of an issue document (board only, audited). Thin: parse, call, serialize."""
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from issues import selectors
from issues.actors import actor_from_request
from issues.services import document_visibility

from . import serializers as s
from .views import ERRORS, parse


class DocumentQuarantineSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=document_visibility.MAX_REASON)


def _document(request, issue_id, key):
    actor = actor_from_request(request)
    issue = selectors.issue_get(actor=actor, pk=issue_id)
    return actor, selectors.document_get(issue=issue, key=key)


class IssueDocumentQuarantineView(APIView):
    @extend_schema(request=DocumentQuarantineSerializer, responses={200: s.DocumentSerializer, **ERRORS},
                   operation_id="issues_documents_quarantine",
                   description="Board only (write role): withhold the document from agents' bounded case page "
                               "reads (`GET /api/cases/{id}?agentRead=true&section=document`); its revisions are "
                               "kept. Idempotent: a quarantined document keeps its first quarantine. Audited as "
                               "`document.quarantined`.")
    def post(self, request, issue_id, key):
        actor, document = _document(request, issue_id, key)
        data = parse(DocumentQuarantineSerializer, request)
        document_visibility.document_quarantine(actor=actor, document=document, reason=data.get("reason", ""))
        return Response(s.DocumentSerializer(selectors.document_get(issue=document.issue, key=key)).data)


class IssueDocumentReleaseView(APIView):
    @extend_schema(request=None, responses={200: s.DocumentSerializer, **ERRORS},
                   operation_id="issues_documents_release",
                   description="Board only (write role): serve a quarantined document to page reads again. "
                               "Idempotent. Audited as `document.released`.")
    def post(self, request, issue_id, key):
        actor, document = _document(request, issue_id, key)
        document_visibility.document_release(actor=actor, document=document)
        return Response(s.DocumentSerializer(selectors.document_get(issue=document.issue, key=key)).data)
