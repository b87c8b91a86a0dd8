"""Routes of the upstream-compatible API (issue #14): goals, projects, costs and budgets, the
company record, the dashboard and the activity log (paperclip-api.md §5.4-§5.9); included by
issues/api/urls.py (after the other routes, so ``companies/<id>`` never shadows a longer path)."""
from django.urls import path

from . import org

urlpatterns = [
    path("companies/<str:company_id>/goals", org.CompanyGoalsView.as_view(), name="company-goals"),
    path("goals/<str:goal_id>", org.GoalDetailView.as_view(), name="goal-detail"),
    path("companies/<str:company_id>/projects", org.CompanyProjectsView.as_view(), name="company-projects"),
    path("projects/<str:project_id>", org.ProjectDetailView.as_view(), name="project-detail"),
    path("companies/<str:company_id>/cost-events", org.CompanyCostEventsView.as_view(), name="company-cost-events"),
    path("companies/<str:company_id>/costs/summary", org.CompanyCostsSummaryView.as_view(),
         name="company-costs-summary"),
    path("companies/<str:company_id>/costs/by-agent", org.CompanyCostsByAgentView.as_view(),
         name="company-costs-by-agent"),
    path("companies/<str:company_id>/costs/by-project", org.CompanyCostsByProjectView.as_view(),
         name="company-costs-by-project"),
    path("companies/<str:company_id>/costs/by-provider", org.CompanyCostsByProviderView.as_view(),
         name="company-costs-by-provider"),
    path("companies/<str:company_id>/costs/by-biller", org.CompanyCostsByBillerView.as_view(),
         name="company-costs-by-biller"),
    path("companies/<str:company_id>/costs/by-agent-model", org.CompanyCostsByAgentModelView.as_view(),
         name="company-costs-by-agent-model"),
    path("companies/<str:company_id>/costs/window-spend", org.CompanyCostsWindowSpendView.as_view(),
         name="company-costs-window-spend"),
    path("companies/<str:company_id>/budgets", org.CompanyBudgetsView.as_view(), name="company-budgets"),
    path("agents/<uuid:agent_id>/budgets", org.AgentBudgetsView.as_view(), name="agent-budgets"),
    path("companies/<str:company_id>/dashboard", org.CompanyDashboardView.as_view(), name="company-dashboard"),
    path("companies/<str:company_id>/activity", org.CompanyActivityView.as_view(), name="company-activity"),
    path("companies/<str:company_id>/archive", org.CompanyArchiveView.as_view(), name="company-archive"),
    path("companies/stats", org.CompanyStatsView.as_view(), name="company-stats"),  # before companies/<id>
    path("companies/<str:company_id>", org.CompanyDetailView.as_view(), name="company-detail"),
]
