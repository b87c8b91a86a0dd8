from django.urls import path

from . import views, work_products

urlpatterns = [
    path("health", views.HealthView.as_view(), name="health"),
    path("agents/me", views.AgentMeView.as_view(), name="agent-me"),
    path("agents/<uuid:agent_id>/wakeup", views.AgentWakeupView.as_view(), name="agent-wakeup"),
    path("companies", views.CompanyListView.as_view(), name="company-list"),
    path("companies/<str:company_id>/issues", views.CompanyIssuesView.as_view(), name="company-issues"),
    path("issues/<str:issue_id>", views.IssueDetailView.as_view(), name="issue-detail"),
    path("issues/<str:issue_id>/checkout", views.IssueCheckoutView.as_view(), name="issue-checkout"),
    path("issues/<str:issue_id>/release", views.IssueReleaseView.as_view(), name="issue-release"),
    path("issues/<str:issue_id>/blockers", views.IssueBlockersView.as_view(), name="issue-blockers"),
    path("issues/<str:issue_id>/comments", views.IssueCommentsView.as_view(), name="issue-comments"),
    path("issues/<str:issue_id>/documents", views.IssueDocumentsView.as_view(), name="issue-documents"),
    path("issues/<str:issue_id>/documents/<str:key>", views.IssueDocumentView.as_view(), name="issue-document"),
    path("issues/<str:issue_id>/documents/<str:key>/revisions", views.IssueDocumentRevisionsView.as_view(),
         name="issue-document-revisions"),
    path("issues/<str:issue_id>/work-products", work_products.IssueWorkProductsView.as_view(),
         name="issue-work-products"),
    path("issues/<str:issue_id>/interactions", views.IssueInteractionsView.as_view(), name="issue-interactions"),
    path("interactions/<uuid:interaction_id>/respond", views.InteractionRespondView.as_view(),
         name="interaction-respond"),
    path("approvals/<uuid:approval_id>", views.ApprovalView.as_view(), name="approval-detail"),
    path("approvals/<uuid:approval_id>/issues", views.ApprovalIssuesView.as_view(), name="approval-issues"),
    path("runs/<uuid:run_id>", views.RunDetailView.as_view(), name="run-detail"),
    path("runs/<uuid:run_id>/heartbeat", views.RunHeartbeatView.as_view(), name="run-heartbeat"),
    path("runs/<uuid:run_id>/events", views.RunEventsView.as_view(), name="run-events"),
    path("issues/<str:issue_id>/run/stop", views.IssueRunStopView.as_view(), name="issue-run-stop"),
]
