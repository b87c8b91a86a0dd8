"""Console routes of the cases app (namespace ``cases_console``), included at "" by paperclip/urls.py."""
from django.urls import path

from . import console

app_name = "cases_console"

urlpatterns = [
    path("cases/", console.case_list, name="case-list"),
    path("cases/<str:ref>/", console.case_detail, name="case-detail"),
    path("cases/<str:ref>/change/", console.case_change, name="case-change"),
    path("cases/<str:ref>/handoffs/", console.handoff_new, name="case-handoff"),
    path("handoffs/<uuid:handoff_id>/retry/", console.handoff_retry, name="handoff-retry"),
    path("handoffs/<uuid:handoff_id>/cancel/", console.handoff_cancel, name="handoff-cancel"),
    path("workflows/", console.workflow_list, name="workflow-list"),
    path("workflows/new/", console.workflow_create, name="workflow-create"),
    path("workflows/preview/", console.workflow_preview, name="workflow-preview"),
    path("workflows/<uuid:definition_id>/", console.workflow_detail, name="workflow-detail"),
    path("workflows/<uuid:definition_id>/edit/", console.workflow_edit, name="workflow-edit"),
]
