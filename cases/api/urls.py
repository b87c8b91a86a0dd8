from django.urls import path

from . import views

urlpatterns = [
    path("companies/<str:company_id>/cases", views.CompanyCasesView.as_view(), name="company-cases"),
    path("companies/<str:company_id>/cases/types", views.CompanyCaseTypesView.as_view(), name="company-case-types"),
    path("cases/<str:case_id>", views.CaseDetailView.as_view(), name="case-detail"),
    path("companies/<str:company_id>/workflow-definitions", views.CompanyWorkflowDefinitionsView.as_view(),
         name="company-workflow-definitions"),
    path("workflow-definitions/<str:definition_id>", views.WorkflowDefinitionDetailView.as_view(),
         name="workflow-definition-detail"),
]
