"""Company assets (upstream's ``POST /companies/{id}/logo``): one raster image stored as an asset
of the company, which ``PATCH /companies/{id}`` (``logoAssetId``) then makes its logo.

Who may: board users with a write role and the company's CEO agent (upstream: branding is the
one company setting a CEO agent changes). The bytes follow the row as attachments' do
(attachments.bytes_before_row; removed when the row goes; orphans swept by
attachments.attachments_orphan_sweep).
"""
from __future__ import annotations

import uuid

from issues.actors import Actor
from issues.choices import AgentRole
from issues.exceptions import Forbidden
from issues.models import Asset, Company
from issues.models.asset import IMAGE_TYPES
from paperclip.core.uploads import checked_upload, sha256_of

from .activity import activity_record
from .attachments import bytes_before_row
from .goals import ensure_org_write

BRANDING_FORBIDDEN = "Only CEO agents or board users may update company settings"  # upstream's words


def ensure_may_brand(actor: Actor, company_id) -> None:
    """Board users with a write role, or a CEO agent of the company (upstream's branding rule)."""
    if actor.is_agent and actor.agent.role != AgentRole.CEO:
        raise Forbidden(BRANDING_FORBIDDEN, code="board_only")
    ensure_org_write(actor, company_id)


def company_logo_upload(*, actor: Actor, company: Company, upload) -> Asset:
    """Store ``upload`` (a Django UploadedFile) as an image asset of the company; audited as
    ``asset.created``. The company's logo changes only when ``logoAssetId`` names it (upstream)."""
    ensure_may_brand(actor, company.pk)
    # image/jpg: a common misspelling upstream accepts
    filename, content_type = checked_upload(upload, noun="Image", accepts=IMAGE_TYPES.__contains__,
                                            accepted=IMAGE_TYPES, aliases={"image/jpg": "image/jpeg"})
    digest = sha256_of(upload)
    pk = uuid.uuid4()
    with bytes_before_row(f"{company.pk}/assets/{pk}", upload) as saved:
        asset = Asset.objects.create(
            pk=pk, company=company, original_filename=filename, content_type=content_type, byte_size=upload.size,
            sha256=digest, object_key=saved, created_by_agent=actor.agent,
            created_by_user=actor.user if actor.is_board else None)
        activity_record(actor=actor, company_id=company.pk, action="asset.created", entity_type="asset",
                        entity_id=asset.pk, details={"originalFilename": filename, "contentType": content_type,
                                                     "byteSize": asset.byte_size, "namespace": "assets/companies"})
    return asset
