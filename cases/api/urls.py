from django.urls import path

from . import document_views, handoff_views, views

urlpatterns = [
    path("companies/<str:company_id>/cases", views.CompanyCasesView.as_view(), name="company-cases"),
    path("companies/<str:company_id>/cases/types", views.CompanyCaseTypesView.as_view(), name="company-case-types"),
    path("cases/<str:case_id>", views.CaseDetailView.as_view(), name="case-detail"),
    path("companies/<str:company_id>/workflows", views.CompanyWorkflowDefinitionsView.as_view(),
         name="company-workflows"),
    path("workflows/<str:definition_id>", views.WorkflowDefinitionDetailView.as_view(),
         name="workflow-detail"),
    path("companies/<str:company_id>/case-handoffs", handoff_views.CompanyCaseHandoffsView.as_view(),
         name="company-case-handoffs"),
    path("cases/<str:case_id>/documents", document_views.CaseDocumentsView.as_view(), name="case-documents"),
    path("cases/<str:case_id>/documents/<str:key>", document_views.CaseDocumentView.as_view(), name="case-document"),
    path("cases/<str:case_id>/documents/<str:key>/revisions", document_views.CaseDocumentRevisionsView.as_view(),
         name="case-document-revisions"),
    path("cases/<str:case_id>/documents/<str:key>/quarantine", document_views.CaseDocumentQuarantineView.as_view(),
         name="case-document-quarantine"),
    path("cases/<str:case_id>/documents/<str:key>/release", document_views.CaseDocumentReleaseView.as_view(),
         name="case-document-release"),
    path("cases/<str:case_id>/handoffs", handoff_views.CaseHandoffsView.as_view(), name="case-handoffs"),
    path("cases/<str:case_id>/handoffs/<str:handoff_id>/retry", handoff_views.CaseHandoffRetryView.as_view(),
         name="case-handoff-retry"),
    path("cases/<str:case_id>/handoffs/<str:handoff_id>/cancel", handoff_views.CaseHandoffCancelView.as_view(),
         name="case-handoff-cancel"),
]

# Bounded paged reads, history and task links live in their own module.
from .read_urls import urlpatterns as _read_urlpatterns  # noqa: E402

urlpatterns += _read_urlpatterns
