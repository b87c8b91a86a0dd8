"""Work products of an issue (``/api/issues/<issue_id>/work-products``): listed by anyone who can
see the issue, recorded by its agents and board users with a write role."""
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from issues import selectors
from issues.actors import actor_from_request
from issues.choices import WorkProductKind
from issues.services import work_products as work_product_services

from .serializers import StrictSerializer
from .views import ERRORS, RUN_HEADER_PARAM, parse


class WorkProductSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    issueId = serializers.UUIDField(source="issue_id")
    kind = serializers.CharField()
    title = serializers.CharField()
    url = serializers.CharField()
    externalId = serializers.CharField(source="external_id")
    status = serializers.CharField()
    runId = serializers.UUIDField(source="run_id", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")


class WorkProductCreateSerializer(StrictSerializer):
    # kind is an enum here (so that the schema lists it); the other values are validated by the
    # service (one field-error shape for the API and other callers).
    kind = serializers.ChoiceField(choices=WorkProductKind.choices)
    title = serializers.CharField(required=False, allow_blank=True, default="")
    url = serializers.CharField(required=False, allow_blank=True, default="")
    externalId = serializers.CharField(required=False, allow_blank=True, default="")
    status = serializers.CharField(required=False, allow_blank=True, default="")


class IssueWorkProductsView(APIView):
    @extend_schema(responses={200: WorkProductSerializer(many=True), **ERRORS},
                   operation_id="issues_work_products_list")
    def get(self, request, issue_id):
        issue = selectors.issue_get(actor=actor_from_request(request), pk=issue_id)
        return Response(WorkProductSerializer(issue.work_products.order_by("created_at"), many=True).data)

    @extend_schema(request=WorkProductCreateSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={201: WorkProductSerializer, **ERRORS}, operation_id="issues_work_products_create")
    def post(self, request, issue_id):
        actor = actor_from_request(request)
        issue = selectors.issue_get(actor=actor, pk=issue_id)
        data = parse(WorkProductCreateSerializer, request)
        work_product = work_product_services.work_product_create(
            actor=actor, issue=issue, kind=data["kind"], title=data["title"], url=data["url"],
            external_id=data["externalId"], status=data["status"])
        return Response(WorkProductSerializer(work_product).data, status=status.HTTP_201_CREATED)
