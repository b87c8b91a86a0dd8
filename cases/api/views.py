"""Case and workflow-definition API. Thin: parse, call a selector or service, serialize.
Every route answers 404 when the company's ``enable_cases`` flag is off."""
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from issues.actors import actor_from_request
from issues.api.views import ERRORS, LIST_PARAMS, RUN_HEADER_PARAM, parse
from issues.filtersets import openapi_parameters

from .. import selectors, services
from ..filtersets import CaseFilterSet, WorkflowDefinitionFilterSet
from . import read_serializers as rs
from . import read_views
from . import serializers as s

CASE_PATCH_FIELDS = {"title": "title", "summary": "summary", "fields": "fields"}


class CompanyCasesView(APIView):
    @extend_schema(parameters=[*openapi_parameters(CaseFilterSet), *LIST_PARAMS],
                   responses={200: s.CaseBrowseSerializer, **ERRORS}, operation_id="company_cases_list",
                   description="Sorting and grouping apply to the whole authorized result before the page is "
                               "taken; status groups follow the lifecycle, project groups stable ids with "
                               "unassigned cases last.")
    def get(self, request, company_id):
        company = selectors.cases_company(actor=actor_from_request(request), company_id=company_id)
        page = selectors.case_browse(company=company, params=request.query_params)
        return Response(s.CaseBrowseSerializer(page).data)

    @extend_schema(request=s.CaseCreateSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={201: s.CaseSerializer, 200: s.CaseSerializer, **ERRORS},
                   operation_id="company_cases_create",
                   description="201 for a new case; 200 with the existing case when the idempotency key was "
                               "already used for this company and type.")
    def post(self, request, company_id):
        actor = actor_from_request(request)
        company = selectors.cases_company(actor=actor, company_id=company_id)
        data = parse(s.CaseCreateSerializer, request)
        case, created = services.case_create(
            actor=actor, company=company, case_type=data["type"], title=data["title"], kickoff=data["kickoff"],
            workflow_document_text=data.get("workflowDocumentText"), summary=data["summary"], status=data["status"],
            fields=data["fields"], parent_id=data.get("parentCaseId"), project_id=data.get("projectId"),
            workflow_definition_id=data.get("workflowDefinitionId"), phase=data["phase"],
            idempotency_key=data["idempotencyKey"], initial_documents=data["initialDocuments"],
            primary_task_id=data.get("primaryTaskId"),
        )
        case = selectors.case_get(actor=actor, pk=case.pk)
        return Response(s.CaseSerializer(case).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class CompanyCaseTypesView(APIView):
    @extend_schema(responses={200: s.CaseTypesSerializer, **ERRORS}, operation_id="company_cases_types")
    def get(self, request, company_id):
        company = selectors.cases_company(actor=actor_from_request(request), company_id=company_id)
        return Response({"types": selectors.case_types(company=company)})


class CaseDetailView(APIView):
    @extend_schema(responses={200: PolymorphicProxySerializer(
                       component_name="CaseRetrieveResponse", resource_type_field_name=None,
                       serializers=[s.CaseDetailSerializer, rs.CaseAgentReadSerializer]), **ERRORS},
                   operation_id="cases_retrieve",
                   description="The case detail; with agentRead=true the bounded agent read (CaseAgentRead): small "
                               "cases structured, large cases, section=fields and section=document as exact UTF-8 "
                               "text pages bound to a snapshot (409 read_snapshot_stale after a change).",
                   parameters=[OpenApiParameter("case_id", str, OpenApiParameter.PATH,
                                                description="UUID or identifier (PREFIX-C<n>)."),
                               rs.CaseReadQuerySerializer])
    def get(self, request, case_id):
        if read_views.is_agent_read(request):
            return read_views.case_agent_read(request, case_id)
        case = selectors.case_detail(actor=actor_from_request(request), pk=case_id)
        return Response(s.CaseDetailSerializer(case).data)

    @extend_schema(request=s.CasePatchSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={200: s.CaseSerializer, **ERRORS}, operation_id="cases_update")
    def patch(self, request, case_id):
        actor = actor_from_request(request)
        case = selectors.case_get(actor=actor, pk=case_id)
        data = parse(s.CasePatchSerializer, request)
        services.case_update(actor=actor, case=case, changes={CASE_PATCH_FIELDS[k]: v for k, v in data.items()})
        return Response(s.CaseSerializer(selectors.case_get(actor=actor, pk=case.pk)).data)


class CompanyWorkflowDefinitionsView(APIView):
    @extend_schema(parameters=[*openapi_parameters(WorkflowDefinitionFilterSet), *LIST_PARAMS],
                   responses={200: s.WorkflowDefinitionSerializer(many=True), **ERRORS},
                   operation_id="company_workflows_list")
    def get(self, request, company_id):
        company = selectors.cases_company(actor=actor_from_request(request), company_id=company_id)
        definitions = selectors.workflow_definition_list(company=company, params=request.query_params)
        return Response(s.WorkflowDefinitionSerializer(definitions, many=True).data)

    @extend_schema(request=s.WorkflowDefinitionCreateSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={201: s.WorkflowDefinitionSerializer, **ERRORS},
                   operation_id="company_workflows_create")
    def post(self, request, company_id):
        actor = actor_from_request(request)
        company = selectors.cases_company(actor=actor, company_id=company_id)
        data = parse(s.WorkflowDefinitionCreateSerializer, request)
        definition = services.workflow_definition_create(actor=actor, company=company, name=data["name"],
                                                         description=data["description"], prompt=data["prompt"])
        return Response(s.WorkflowDefinitionSerializer(definition).data, status=status.HTTP_201_CREATED)


class WorkflowDefinitionDetailView(APIView):
    @extend_schema(responses={200: PolymorphicProxySerializer(
                       component_name="WorkflowRetrieveResponse", resource_type_field_name=None,
                       serializers=[s.WorkflowDefinitionSerializer, rs.WorkflowPromptPageSerializer]), **ERRORS},
                   parameters=[rs.WorkflowPromptQuerySerializer], operation_id="workflows_retrieve",
                   description="The definition; with offsetBytes/limitBytes/fingerprint one page of the prompt "
                               "(WorkflowPromptPage) pinned to its fingerprint (409 read_snapshot_stale after any "
                               "edit).")
    def get(self, request, definition_id):
        if read_views.is_prompt_page(request):
            return read_views.workflow_prompt_page(request, definition_id)
        definition = selectors.workflow_definition_get(actor=actor_from_request(request), pk=definition_id)
        return Response(s.WorkflowDefinitionSerializer(definition).data)

    @extend_schema(request=s.WorkflowDefinitionPatchSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={200: s.WorkflowDefinitionSerializer, **ERRORS},
                   operation_id="workflows_update")
    def patch(self, request, definition_id):
        actor = actor_from_request(request)
        definition = selectors.workflow_definition_get(actor=actor, pk=definition_id)
        data = parse(s.WorkflowDefinitionPatchSerializer, request)
        definition = services.workflow_definition_update(actor=actor, definition=definition, changes=dict(data))
        return Response(s.WorkflowDefinitionSerializer(definition).data)
