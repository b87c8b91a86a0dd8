"""Issue attachments (upstream's core routes, ref §5 "Attachments"): upload, list, download, delete;
and the company logo's upload and bytes (upstream's assets, §5.9).

The rules (who writes, limits, types, the bytes following the row) are in issues/services/attachments.py
and issues/services/assets.py.
"""
from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.parsers import MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from issues import selectors
from issues.actors import actor_from_request
from issues.models import Issue
from issues.services import assets as asset_services
from issues.services import attachments as attachment_services
from paperclip.core.uploads import one_uploaded_file

from .agent_serializers import OkSerializer
from .attachment_serializers import (AssetSerializer, AttachmentSerializer, AttachmentUploadSerializer,
                                     LogoUploadSerializer)
from .representation import validated
from .views import ERRORS, RUN_HEADER_PARAM

# Every answer is sandboxed and never sniffed, so a file that claims to be an image cannot run as a
# page of this origin (what is shown inline at all: Attachment.shows_inline).
CONTENT_CSP = "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; sandbox"


class IssueAttachmentUploadView(APIView):
    parser_classes = [MultiPartParser]

    @extend_schema(request={"multipart/form-data": AttachmentUploadSerializer}, parameters=[RUN_HEADER_PARAM],
                   responses={201: AttachmentSerializer, **ERRORS}, operation_id="issues_attachments_create",
                   description="Attach one file (multipart field `file`) to the issue; `issueCommentId` ties it to "
                               "one of the issue's comments. Any agent of the company may attach (from the checkout "
                               "run while the issue is in progress), as for comments. 400 `Missing file field "
                               "'file'`; 422 `Attachment exceeds <N> bytes`, `Attachment is empty`, `Unsupported "
                               "attachment type: <type>` (PAPERCLIP_ATTACHMENT_MAX_BYTES, "
                               "PAPERCLIP_ATTACHMENT_ALLOWED_TYPES).")
    def post(self, request, company_id, issue_id):
        actor = actor_from_request(request)
        company = actor.company(company_id)
        issue = selectors.get_by_ref(Issue.objects.filter(company=company), actor, issue_id, "Issue")
        upload = one_uploaded_file(request, "file")
        data = validated(AttachmentUploadSerializer, request.data)
        attachment = attachment_services.attachment_create(actor=actor, issue=issue, upload=upload,
                                                           comment_id=data.get("issueCommentId"))
        return Response(AttachmentSerializer(attachment).data, status=status.HTTP_201_CREATED)


class IssueAttachmentsView(APIView):
    @extend_schema(responses={200: AttachmentSerializer(many=True), **ERRORS}, operation_id="issues_attachments_list",
                   description="The issue's attachments, oldest first.")
    def get(self, request, issue_id):
        issue = selectors.issue_row(actor=actor_from_request(request), pk=issue_id)
        return Response(AttachmentSerializer(selectors.attachment_list(issue=issue), many=True).data)


class AttachmentDetailView(APIView):
    @extend_schema(responses={200: AttachmentSerializer, **ERRORS}, operation_id="attachments_retrieve")
    def get(self, request, attachment_id):
        attachment = selectors.attachment_get(actor=actor_from_request(request), pk=attachment_id)
        return Response(AttachmentSerializer(attachment).data)

    @extend_schema(request=None, parameters=[RUN_HEADER_PARAM], responses={200: OkSerializer, **ERRORS},
                   operation_id="attachments_delete",
                   description="Deletes the attachment and its stored bytes. Board users with write access, or the "
                               "agent that uploaded it (another agent: 403 attachment_not_owned).")
    def delete(self, request, attachment_id):
        actor = actor_from_request(request)
        attachment = selectors.attachment_get(actor=actor, pk=attachment_id)
        attachment_services.attachment_delete(actor=actor, attachment=attachment)
        return Response(OkSerializer({"ok": True}).data)


def stored_file_response(stored, *, served_type: str, inline: bool, filename: str, byte_size: int, sha256: str):
    """The bytes of an attachment or asset: sandboxed, never sniffed, revalidated by their hash."""
    response = FileResponse(stored, content_type=served_type, as_attachment=not inline, filename=filename)
    response["Content-Length"] = str(byte_size)
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = CONTENT_CSP
    response["Cache-Control"] = "private, no-cache"
    response["ETag"] = f'"{sha256}"'
    return response


class AttachmentContentView(APIView):
    @extend_schema(responses={(200, "*/*"): OpenApiResponse(OpenApiTypes.BINARY, description="The stored bytes."),
                              **ERRORS},
                   operation_id="attachments_content",
                   description="The bytes with their stored Content-Type. Raster images and text/plain are shown "
                               "inline, anything else is a download; every answer is sandboxed (CSP) and nosniff.")
    def get(self, request, attachment_id):
        attachment = selectors.attachment_get(actor=actor_from_request(request), pk=attachment_id)
        return stored_file_response(selectors.attachment_content(attachment), served_type=attachment.served_type,
                                    inline=attachment.shows_inline, filename=attachment.original_filename,
                                    byte_size=attachment.byte_size, sha256=attachment.sha256)

    def perform_content_negotiation(self, request, force=False):
        # The bytes bypass DRF's renderers; errors are JSON whatever the client accepts.
        return super().perform_content_negotiation(request, force=True)


class CompanyLogoUploadView(APIView):
    parser_classes = [MultiPartParser]

    @extend_schema(request={"multipart/form-data": LogoUploadSerializer}, parameters=[RUN_HEADER_PARAM],
                   responses={201: AssetSerializer, **ERRORS}, operation_id="companies_logo_upload",
                   description="Stores one image (multipart field `file`: PNG, JPEG, GIF or WebP) as an asset of "
                               "the company; `PATCH /companies/{id}` with its `logoAssetId` makes it the logo. Board "
                               "users with a write role, or the company's CEO agent (other agents 403). 400 `Missing "
                               "file field 'file'`; 422 `Image is empty`, `Unsupported image type: <type>` (SVG is "
                               "not taken), `Attachment exceeds <N> bytes`.")
    def post(self, request, company_id):
        actor = actor_from_request(request)
        company = actor.company(company_id)
        asset = asset_services.company_logo_upload(actor=actor, company=company, upload=one_uploaded_file(request))
        return Response(AssetSerializer(asset).data, status=status.HTTP_201_CREATED)


class AssetContentView(APIView):
    @extend_schema(responses={(200, "image/*"): OpenApiResponse(OpenApiTypes.BINARY, description="The image."),
                              **ERRORS},
                   operation_id="assets_content",
                   description="An asset's bytes (a company logo: the company's `logoUrl`), inline, sandboxed and "
                               "nosniff; members and agents of the company.")
    def get(self, request, asset_id):
        asset = selectors.asset_get(actor=actor_from_request(request), pk=asset_id)
        return stored_file_response(selectors.asset_content(asset), served_type=asset.content_type, inline=True,
                                    filename=asset.original_filename, byte_size=asset.byte_size, sha256=asset.sha256)

    def perform_content_negotiation(self, request, force=False):
        return super().perform_content_negotiation(request, force=True)
