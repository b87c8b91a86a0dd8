"""Console routes of the connectors app (namespace ``connectors_console``), included at "" by
paperclip/urls.py."""
from django.urls import path

from .console import export, outbound, policies, views

app_name = "connectors_console"

urlpatterns = [
    path("connectors/", views.instance_list, name="instance-list"),
    path("connectors/conflicts/", views.conflict_list, name="conflict-list"),
    path("connectors/conflicts/<uuid:conflict_id>/resolve/", views.conflict_resolve_view, name="conflict-resolve"),
    path("connectors/events/<str:event_id>/replay/", views.event_replay_view, name="event-replay"),
    path("connectors/outbound/<str:effect_id>/replay/", outbound.outbound_replay_view, name="outbound-replay"),
    path("connectors/<uuid:instance_id>/outbound/replay/", outbound.outbound_replay_all_view,
         name="outbound-replay-all"),
    path("connectors/links/<uuid:link_id>/<str:action>/", views.link_action, name="link-action"),
    path("connectors/issues/<str:identifier>/export/", export.issue_export_view, name="issue-export"),
    path("connectors/<uuid:instance_id>/", views.instance_detail, name="instance-detail"),
    path("connectors/<uuid:instance_id>/live/", views.instance_health_live, name="instance-live"),
    path("connectors/<uuid:instance_id>/pause/", views.instance_pause_view, name="instance-pause"),
    path("connectors/<uuid:instance_id>/resume/", views.instance_resume_view, name="instance-resume"),
    path("connectors/<uuid:instance_id>/policies/", policies.instance_policies_view, name="instance-policies"),
    path("connectors/link-close-policy/<uuid:link_id>/", policies.link_close_policy_view, name="link-close-policy"),
]
