"""Console routes of the connectors app (namespace ``connectors_console``), included at "" by
paperclip/urls.py."""
from django.urls import path

from .console import export, outbound, policies, setup, views

app_name = "connectors_console"

urlpatterns = [
    path("connectors/", views.instance_list, name="instance-list"),
    path("connectors/conflicts/", views.conflict_list, name="conflict-list"),
    # console setup of a connector (connectors/console/setup.py)
    path("connectors/new/", setup.connector_new, name="connector-new"),
    path("connectors/new/<str:provider_key>/", setup.connector_create_view, name="connector-create"),
    path("connectors/<uuid:instance_id>/settings/", setup.connector_edit_view, name="connector-edit"),
    path("connectors/<uuid:instance_id>/setup/check-mapping/", setup.mapping_check_view,
         name="connector-check-mapping"),
    path("connectors/<uuid:instance_id>/setup/poll/", setup.poll_now_view, name="connector-poll"),
    path("connectors/<uuid:instance_id>/setup/register-webhooks/", setup.register_webhooks_view,
         name="connector-register-webhooks"),
    path("connectors/<uuid:instance_id>/setup/handshake-window/", setup.handshake_window_view,
         name="connector-handshake-window"),
    path("connectors/<uuid:instance_id>/setup/verification-token/", setup.verification_token_view,
         name="connector-verification-token"),
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
