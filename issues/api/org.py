"""Goals, projects, costs, budgets, the company record, the dashboard and the activity log over
the API, upstream-compatible (paperclip-api.md §5.4-§5.9).

Thin views: parse, call a selector or a service (``goals``, ``projects``, ``costs``,
``activity_reports``), serialize. Who may write is the services' rule.
"""
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from issues import cost_reports, selectors
from issues.actors import actor_from_request
from issues.filtersets import ActivityFilterSet, GoalFilterSet, ProjectFilterSet, openapi_parameters
from issues.services import companies as company_services
from issues.services import costs as cost_services
from issues.services import goals as goal_services
from issues.services import projects as project_services
from issues.services.activity_reports import activity_report

from . import org_serializers as o
from .agent_serializers import AgentRecordSerializer, OkSerializer
from .views import ERRORS, LIST_PARAMS, RUN_HEADER_PARAM, parse

WINDOW_PARAMS = [
    OpenApiParameter("from", str, description="ISO 8601 date or date-time (inclusive). With neither from nor to: "
                                              "the current UTC month. A bad value is a 400 `invalid 'from' date`."),
    OpenApiParameter("to", str, description="ISO 8601 date or date-time (inclusive; a date covers the whole day)."),
]
GOAL_PATCH_FIELDS = ("title", "description", "level", "status", "parentId", "ownerAgentId")


def parse_partial(serializer_class, request):
    """A PATCH body: only the fields given (no defaults, nothing required)."""
    serializer = serializer_class(data=request.data, partial=True)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


# --- goals ------------------------------------------------------------------------------------------
class CompanyGoalsView(APIView):
    @extend_schema(parameters=[*openapi_parameters(GoalFilterSet), *LIST_PARAMS],
                   responses={200: o.GoalSerializer(many=True), **ERRORS}, operation_id="company_goals_list")
    def get(self, request, company_id):
        company = actor_from_request(request).company(company_id)
        return Response(o.GoalSerializer(selectors.goal_list(company=company, params=request.query_params),
                                         many=True).data)

    @extend_schema(request=o.GoalWriteSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={201: o.GoalSerializer, **ERRORS}, operation_id="company_goals_create",
                   description="Board users (write roles) and the company's agents. `parentId` and "
                               "`ownerAgentId` name objects of the same company (404 otherwise).")
    def post(self, request, company_id):
        actor = actor_from_request(request)
        company = actor.company(company_id)
        data = parse(o.GoalWriteSerializer, request)
        goal = goal_services.goal_create(
            actor=actor, company=company, title=data["title"], description=data.get("description") or "",
            level=data["level"], status=data["status"], parent_id=data.get("parentId"),
            owner_agent_id=data.get("ownerAgentId"))
        return Response(o.GoalSerializer(goal).data, status=status.HTTP_201_CREATED)


class GoalDetailView(APIView):
    @extend_schema(responses={200: o.GoalSerializer, **ERRORS}, operation_id="goals_retrieve")
    def get(self, request, goal_id):
        return Response(o.GoalSerializer(selectors.goal_get(actor=actor_from_request(request), pk=goal_id)).data)

    @extend_schema(request=o.GoalWriteSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={200: o.GoalSerializer, **ERRORS}, operation_id="goals_update",
                   description="Partial. A parent that would make the goal its own ancestor is a 422 `goal_cycle`.")
    def patch(self, request, goal_id):
        actor = actor_from_request(request)
        goal = selectors.goal_get(actor=actor, pk=goal_id)
        data = parse_partial(o.GoalWriteSerializer, request)
        goal = goal_services.goal_update(actor=actor, goal=goal,
                                         changes={k: v for k, v in data.items() if k in GOAL_PATCH_FIELDS})
        return Response(o.GoalSerializer(goal).data)

    @extend_schema(request=None, parameters=[RUN_HEADER_PARAM], responses={200: o.GoalSerializer, **ERRORS},
                   operation_id="goals_delete", description="Answers the deleted goal (upstream). Its children, "
                                                            "issues and cost events lose the link.")
    def delete(self, request, goal_id):
        actor = actor_from_request(request)
        goal = selectors.goal_get(actor=actor, pk=goal_id)
        return Response(o.GoalSerializer(goal_services.goal_delete(actor=actor, goal=goal)).data)


# --- projects -----------------------------------------------------------------------------------------
PROJECT_DOC = ("Upstream's `workspace {cwd, repoUrl, repoRef}` and `executionWorkspacePolicy` map onto "
               "`repository`, `baseRef`, `workspaceStrategy` and `branchTemplate` (also accepted by these names). "
               "A server folder (`cwd`, or an ssh/file repository) is set by staff users only (403 "
               "`repository_staff_only`); other board users give an https URL the outbound guard accepts. Agents "
               "change name, description and status only (403 `board_only` naming a workspace field). A name "
               "taken in the company (case-insensitive) is a 409 `project_name_taken`.")


class CompanyProjectsView(APIView):
    @extend_schema(parameters=[*openapi_parameters(ProjectFilterSet), *LIST_PARAMS],
                   responses={200: o.ProjectSerializer(many=True), **ERRORS}, operation_id="company_projects_list")
    def get(self, request, company_id):
        company = actor_from_request(request).company(company_id)
        return Response(o.ProjectSerializer(selectors.project_list(company=company, params=request.query_params),
                                            many=True).data)

    @extend_schema(request=o.ProjectWriteSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={201: o.ProjectSerializer, **ERRORS}, operation_id="company_projects_create",
                   description=PROJECT_DOC)
    def post(self, request, company_id):
        actor = actor_from_request(request)
        company = actor.company(company_id)
        data = parse(o.ProjectWriteSerializer, request)
        project = project_services.project_create(actor=actor, company=company, data=data)
        return Response(o.ProjectSerializer(project).data, status=status.HTTP_201_CREATED)


class ProjectDetailView(APIView):
    @extend_schema(responses={200: o.ProjectSerializer, **ERRORS}, operation_id="projects_retrieve")
    def get(self, request, project_id):
        project = selectors.project_get(actor=actor_from_request(request), pk=project_id)
        return Response(o.ProjectSerializer(project).data)

    @extend_schema(request=o.ProjectWriteSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={200: o.ProjectSerializer, **ERRORS}, operation_id="projects_update",
                   description=f"Partial. {PROJECT_DOC}")
    def patch(self, request, project_id):
        actor = actor_from_request(request)
        project = selectors.project_get(actor=actor, pk=project_id)
        data = parse_partial(o.ProjectWriteSerializer, request)
        return Response(o.ProjectSerializer(project_services.project_update(actor=actor, project=project,
                                                                            data=data)).data)


# --- costs and budgets ----------------------------------------------------------------------------------
class CompanyCostEventsView(APIView):
    @extend_schema(request=o.CostEventCreateSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={201: o.CostEventSerializer, **ERRORS}, operation_id="company_cost_events_create",
                   description="Board users for any agent of the company; an agent for itself only (403 `Agent can "
                               "only report its own costs`). `occurredAt` is required. The cents are added to the "
                               "agent's and the company's monthly spend (the same ledger as run heartbeats' usage); "
                               "reaching the agent's budget puts it under its budget stop.")
    def post(self, request, company_id):
        actor = actor_from_request(request)
        company = actor.company(company_id)
        data = parse(o.CostEventCreateSerializer, request)
        event = cost_services.cost_event_create(actor=actor, company=company, data=data)
        return Response(o.CostEventSerializer(event).data, status=status.HTTP_201_CREATED)


def cost_report_view(name: str, report, response, operation_id: str, description: str = "", windowed: bool = True):
    """A read-only view of one cost report (issues.cost_reports): the path's company, the report's rows."""

    class CostReportView(APIView):
        @extend_schema(parameters=WINDOW_PARAMS if windowed else [], responses={200: response, **ERRORS},
                       operation_id=operation_id, description=description)
        def get(self, request, company_id):
            company = actor_from_request(request).company(company_id)
            return Response(report(company=company, params=request.query_params))

    CostReportView.__name__ = CostReportView.__qualname__ = name
    return CostReportView


CompanyCostsSummaryView = cost_report_view("CompanyCostsSummaryView", cost_reports.cost_summary,
                                           o.CostSummarySerializer, "company_costs_summary")
CompanyCostsByAgentView = cost_report_view("CompanyCostsByAgentView", cost_reports.costs_by_agent,
                                           o.CostByAgentSerializer(many=True), "company_costs_by_agent")
CompanyCostsByProjectView = cost_report_view("CompanyCostsByProjectView", cost_reports.costs_by_project,
                                             o.CostByProjectSerializer(many=True), "company_costs_by_project")
CompanyCostsByProviderView = cost_report_view(
    "CompanyCostsByProviderView", cost_reports.costs_by_provider, o.CostByProviderSerializer(many=True),
    "company_costs_by_provider", "Spend per provider, biller, billing type and model, most spent first.")
CompanyCostsByBillerView = cost_report_view(
    "CompanyCostsByBillerView", cost_reports.costs_by_biller, o.CostByBillerSerializer(many=True),
    "company_costs_by_biller", "Spend per biller with how many providers and models it billed, most spent first.")
CompanyCostsByAgentModelView = cost_report_view(
    "CompanyCostsByAgentModelView", cost_reports.costs_by_agent_model, o.CostByAgentModelSerializer(many=True),
    "company_costs_by_agent_model",
    "Spend per agent, provider, biller, billing type and model, ordered by provider, biller, billing type and model.")
CompanyCostsWindowSpendView = cost_report_view(
    "CompanyCostsWindowSpendView", cost_reports.costs_window_spend, o.CostWindowSpendSerializer(many=True),
    "company_costs_window_spend",
    "Spend per provider over the last 5 hours, 24 hours and 7 days (rows of each window, most spent first).",
    windowed=False)


class CompanyBudgetsView(APIView):
    @extend_schema(request=o.BudgetSerializer, responses={200: o.CompanySerializer, **ERRORS},
                   operation_id="company_budgets_update", description="Board only.")
    def patch(self, request, company_id):
        actor = actor_from_request(request)
        company = actor.company(company_id)
        data = parse(o.BudgetSerializer, request)
        company = cost_services.company_budget_set(actor=actor, company=company,
                                                   budget_monthly_cents=data["budgetMonthlyCents"])
        return Response(o.CompanySerializer(company).data)


class AgentBudgetsView(APIView):
    @extend_schema(request=o.BudgetSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={200: AgentRecordSerializer, **ERRORS}, operation_id="agent_budgets_update",
                   description="Board users; an agent for itself only (403 `Agent can only change its own "
                               "budget`). 0 means no limit; the budget stop follows the new budget.")
    def patch(self, request, agent_id):
        actor = actor_from_request(request)
        agent = selectors.agent_get(actor=actor, pk=agent_id)
        data = parse(o.BudgetSerializer, request)
        agent = cost_services.agent_budget_set(actor=actor, agent=agent,
                                               budget_monthly_cents=data["budgetMonthlyCents"])
        return Response(AgentRecordSerializer(agent, context={"redact": not actor.is_board}).data)


# --- the company record -------------------------------------------------------------------------------------
class CompanyStatsView(APIView):
    @extend_schema(responses={200: OpenApiResponse(
                       {"type": "object", "additionalProperties": {
                           "type": "object", "properties": {"agentCount": {"type": "integer"},
                                                            "issueCount": {"type": "integer"}},
                           "required": ["agentCount", "issueCount"]}},
                       description="Company id -> its counts."), **ERRORS},
                   operation_id="companies_stats",
                   description="Board only: how many agents and issues each of the caller's companies has.")
    def get(self, request):
        return Response(selectors.company_stats(actor=actor_from_request(request)))


class CompanyDetailView(APIView):
    @extend_schema(responses={200: o.CompanySerializer, **ERRORS}, operation_id="companies_retrieve")
    def get(self, request, company_id):
        return Response(o.CompanySerializer(actor_from_request(request).company(company_id)).data)

    @extend_schema(request=o.CompanyPatchSerializer, parameters=[RUN_HEADER_PARAM],
                   responses={200: o.CompanySerializer, **ERRORS}, operation_id="companies_update",
                   description="Board users: name, description, status, budgetMonthlyCents, "
                               "requireBoardApprovalForNewAgents; a CEO agent: name and "
                               "description (other agents 403). `issuePrefix` cannot change (400). A company "
                               "that is paused or archived, or whose monthly budget is spent, stops its agents "
                               "(paused with pauseReason company_paused / company_archived / "
                               "company_budget_exceeded, live runs cancelled); active and under budget again, "
                               "the agents it paused resume.")
    def patch(self, request, company_id):
        actor = actor_from_request(request)
        company = actor.company(company_id)
        data = parse(o.CompanyPatchSerializer, request)
        return Response(o.CompanySerializer(cost_services.company_update(actor=actor, company=company,
                                                                         changes=data)).data)

    @extend_schema(request=None, responses={200: OkSerializer, **ERRORS}, operation_id="companies_delete",
                   description="Board owners only: deletes an archived company with everything in it (`{ok: true}`). "
                               "409 `company_not_archived` until it is archived (POST …/archive, which stops its "
                               "agents), 409 `company_run_active` while a cancelled run is still ending; 403 "
                               "`owner_required` for other roles.")
    def delete(self, request, company_id):
        actor = actor_from_request(request)
        company_services.company_delete(actor=actor, company=actor.company(company_id))
        return Response(OkSerializer({"ok": True}).data)


class CompanyArchiveView(APIView):
    @extend_schema(request=None, responses={200: o.CompanySerializer, **ERRORS}, operation_id="companies_archive",
                   description="Board only (upstream): the company's status becomes archived, which stops its "
                               "agents (pauseReason company_archived, live runs cancelled) as PATCH status does. "
                               "Archiving an archived company changes nothing.")
    def post(self, request, company_id):
        actor = actor_from_request(request)
        company = actor.company(company_id)
        return Response(o.CompanySerializer(cost_services.company_archive(actor=actor, company=company)).data)


# --- dashboard and activity -----------------------------------------------------------------------------------
class CompanyDashboardView(APIView):
    @extend_schema(responses={200: o.DashboardSerializer, **ERRORS}, operation_id="company_dashboard")
    def get(self, request, company_id):
        company = actor_from_request(request).company(company_id)
        return Response(o.DashboardSerializer(selectors.org_dashboard(company=company)).data)


class CompanyActivityView(APIView):
    @extend_schema(parameters=[*openapi_parameters(ActivityFilterSet), *LIST_PARAMS],
                   responses={200: o.ActivityEntrySerializer(many=True), **ERRORS}, operation_id="company_activity_list",
                   description="Newest first.")
    def get(self, request, company_id):
        company = actor_from_request(request).company(company_id)
        return Response(o.ActivityEntrySerializer(selectors.activity_list(company=company, params=request.query_params),
                                             many=True).data)

    @extend_schema(request=o.ActivityCreateSerializer, responses={201: o.ActivityEntrySerializer, **ERRORS},
                   operation_id="company_activity_create",
                   description="Board only. The row's actor is the board user who wrote it; a claimed actorType, "
                               "actorId and agentId are kept in `details.reportedActor`.")
    def post(self, request, company_id):
        actor = actor_from_request(request)
        company = actor.company(company_id)
        data = parse(o.ActivityCreateSerializer, request)
        row = activity_report(actor=actor, company=company, action=data["action"], entity_type=data["entityType"],
                              entity_id=data["entityId"], details=data["details"], actor_type=data["actorType"],
                              actor_id=data["actorId"], agent_id=data.get("agentId"))
        return Response(o.ActivityEntrySerializer(row).data, status=status.HTTP_201_CREATED)
