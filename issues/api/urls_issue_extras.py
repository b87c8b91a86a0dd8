"""Routes of the upstream-compatible API (issue #14): issue extras (children, labels, attachments); included by
issues/api/urls.py. ``DELETE /issues/{id}`` is a method of the issue-detail route."""
from django.urls import path

from . import attachments, issue_extras

urlpatterns = [
    path("issues", issue_extras.IssuesWithoutCompanyView.as_view(), name="issues-without-company"),
    path("issues/<str:issue_id>/comments/<str:comment_id>", issue_extras.IssueCommentDetailView.as_view(),
         name="issue-comment-detail"),
    path("issues/<str:issue_id>/activity", issue_extras.IssueActivityView.as_view(), name="issue-activity"),
    path("issues/<str:issue_id>/runs", issue_extras.IssueRunsView.as_view(), name="issue-runs"),
    path("issues/<str:issue_id>/children", issue_extras.IssueChildrenView.as_view(), name="issue-children"),
    path("issues/<str:issue_id>/heartbeat-context", issue_extras.IssueHeartbeatContextView.as_view(),
         name="issue-heartbeat-context"),
    path("companies/<str:company_id>/issues/<str:issue_id>/attachments",
         attachments.IssueAttachmentUploadView.as_view(), name="issue-attachment-upload"),
    path("issues/<str:issue_id>/attachments", attachments.IssueAttachmentsView.as_view(), name="issue-attachments"),
    path("attachments/<str:attachment_id>", attachments.AttachmentDetailView.as_view(), name="attachment-detail"),
    path("companies/<str:company_id>/logo", attachments.CompanyLogoUploadView.as_view(), name="company-logo"),
    path("assets/<str:asset_id>/content", attachments.AssetContentView.as_view(), name="asset-content"),
    path("attachments/<str:attachment_id>/content", attachments.AttachmentContentView.as_view(),
         name="attachment-content"),
    path("companies/<str:company_id>/labels", issue_extras.CompanyLabelsView.as_view(), name="company-labels"),
    path("labels/<uuid:label_id>", issue_extras.LabelDetailView.as_view(), name="label-detail"),
]
