"""Routes of bounded paged reads' neighbours: history and task links (the paged modes themselves
are query parameters of ``cases/{id}`` and ``workflows/{id}``)."""
from django.urls import path

from . import read_views

urlpatterns = [
    path("cases/<str:case_id>/events", read_views.CaseEventsView.as_view(), name="case-events"),
    path("cases/<str:case_id>/links", read_views.CaseLinksView.as_view(), name="case-links"),
    path("cases/<str:case_id>/links/<str:issue_id>", read_views.CaseLinkDetailView.as_view(),
         name="case-link-detail"),
    path("issues/<str:issue_id>/cases", read_views.IssueCasesView.as_view(), name="issue-cases"),
]
