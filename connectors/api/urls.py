from django.urls import path

from . import views, webhook

urlpatterns = [
    path("companies/<str:company_id>/connectors", views.CompanyConnectorsView.as_view(), name="connector-instances"),
    path("connectors/<str:instance_id>", views.ConnectorDetailView.as_view(), name="connector-detail"),
    path("connectors/<str:instance_id>/webhook", webhook.webhook, name="connector-webhook"),
    path("connectors/<str:instance_id>/health", views.ConnectorHealthView.as_view(), name="connector-health"),
    path("connectors/<str:instance_id>/links", views.ConnectorLinksView.as_view(), name="connector-links"),
    path("connectors/<str:instance_id>/conflicts", views.ConnectorConflictsView.as_view(), name="connector-conflicts"),
    path("connectors/<str:instance_id>/events", views.ConnectorEventsView.as_view(), name="connector-events"),
    path("connectors/<str:instance_id>/import", views.ConnectorImportView.as_view(), name="connector-import"),
    path("connectors/<str:instance_id>/pause", views.ConnectorPauseView.as_view(), name="connector-pause"),
    path("connectors/<str:instance_id>/resume", views.ConnectorResumeView.as_view(), name="connector-resume"),
    path("connectors/<str:instance_id>/credentials", views.ConnectorCredentialsView.as_view(),
         name="connector-credentials"),
    path("connector-links/<str:link_id>", views.LinkDetailView.as_view(), name="connector-link-detail"),
    path("connector-links/<str:link_id>/activity", views.LinkActivityView.as_view(), name="connector-link-activity"),
    path("connector-links/<str:link_id>/outbound", views.LinkOutboundView.as_view(), name="connector-link-outbound"),
    path("connector-links/<str:link_id>/pause", views.LinkPauseView.as_view(), name="connector-link-pause"),
    path("connector-links/<str:link_id>/resume", views.LinkResumeView.as_view(), name="connector-link-resume"),
    path("connector-links/<str:link_id>/resync", views.LinkResyncView.as_view(), name="connector-link-resync"),
    path("connector-links/<str:link_id>/unlink", views.LinkUnlinkView.as_view(), name="connector-link-unlink"),
    path("connector-events/<str:event_id>/replay", views.EventReplayView.as_view(), name="connector-event-replay"),
    path("connector-conflicts/<str:conflict_id>", views.ConflictDetailView.as_view(), name="connector-conflict-detail"),
    path("connector-conflicts/<str:conflict_id>/resolve", views.ConflictResolveView.as_view(),
         name="connector-conflict-resolve"),
    path("issues/<str:issue_id>/connector-links", views.IssueConnectorLinksView.as_view(),
         name="connector-issue-links"),
]
