"""Company branding (upstream §5.9): ``POST /companies/{id}/logo`` stores an image as an asset of the
company, ``PATCH /companies/{id}`` with ``logoAssetId`` / ``brandColor`` sets the branding, and the
company record shows ``logoAssetId``, ``logoUrl`` and ``brandColor``; ``GET /assets/{id}/content``
serves the bytes. Board users with a write role and the company's CEO agent may brand it."""
import hashlib
import os
import time

import pytest

from issues.models import ActivityLog, Asset, Company
from issues.models.attachment import attachment_storage
from issues.services import attachments as attachment_services
from tests.attachment_files import PNG, a_file
from tests.factories import AgentFactory, CompanyFactory, MembershipFactory
from tests.test_errors import assert_error
from rest_framework.test import APIClient


def upload_logo(client, company, name="logo.png", content=PNG, content_type="image/png"):
    return client.post(f"/api/companies/{company.pk}/logo", {"file": a_file(name, content, content_type)},
                       format="multipart")


def patch(client, company, **body):
    return client.patch(f"/api/companies/{company.pk}", body, format="json")


def content_of(response):
    return b"".join(response.streaming_content)


def stored(asset_id) -> bool:
    return attachment_storage().exists(Asset.objects.get(pk=asset_id).object_key)


def test_board_uploads_a_logo_then_makes_it_the_companys_and_reads_it_back(board_client, company):
    response = upload_logo(board_client, company)

    assert response.status_code == 201, response.content
    asset = response.json()
    assert (asset["companyId"], asset["contentType"], asset["byteSize"], asset["originalFilename"]) == (
        str(company.pk), "image/png", len(PNG), "logo.png")
    assert asset["sha256"] == hashlib.sha256(PNG).hexdigest() and asset["contentPath"].endswith("/content")
    assert asset["objectKey"] == f"{company.pk}/assets/{asset['assetId']}" and stored(asset["assetId"])
    audit = ActivityLog.objects.get(action="asset.created")
    assert (audit.entity_type, audit.entity_id, audit.details["byteSize"]) == ("asset", asset["assetId"], len(PNG))
    # Upstream's two steps: the upload stores the image, the PATCH makes it the logo.
    assert board_client.get(f"/api/companies/{company.pk}").json()["logoAssetId"] is None
    record = patch(board_client, company, logoAssetId=asset["assetId"]).json()
    assert record["logoAssetId"] == asset["assetId"] and record["logoUrl"] == f"/api/assets/{asset['assetId']}/content"

    served = board_client.get(record["logoUrl"])

    assert served.status_code == 200 and content_of(served) == PNG
    assert served["Content-Type"] == "image/png" and served["X-Content-Type-Options"] == "nosniff"
    assert "sandbox" in served["Content-Security-Policy"] and served["ETag"] == f'"{asset["sha256"]}"'
    assert not served["Content-Disposition"].startswith("attachment")
    cleared = patch(board_client, company, logoAssetId=None).json()
    assert (cleared["logoAssetId"], cleared["logoUrl"]) == (None, None)


def test_brand_color_is_a_hex_color_stored_lower_case_and_cleared_by_null(board_client, company):
    assert patch(board_client, company, brandColor="#A1B2C3").json()["brandColor"] == "#a1b2c3"
    assert ActivityLog.objects.filter(action="company.updated").latest("id").details == {"changedKeys": ["brandColor"]}
    for bad in ("red", "#12345", "#1234567", "12345678", 7):
        assert_error(patch(board_client, company, brandColor=bad), 400, fields=("brandColor",))
    assert Company.objects.get(pk=company.pk).brand_color == "#a1b2c3"
    assert patch(board_client, company, brandColor=None).json()["brandColor"] is None


def test_the_ceo_agent_brands_the_company_and_other_agents_may_not(make_agent_client, company):
    ceo = make_agent_client(AgentFactory(company=company, role="ceo"))
    engineer = make_agent_client(AgentFactory(company=company, role="engineer"))

    assert_error(upload_logo(engineer, company), 403, "board_only")
    assert_error(patch(engineer, company, brandColor="#000000"), 403, "board_only")
    assert not Asset.objects.exists()

    asset = upload_logo(ceo, company).json()
    assert asset["createdByAgentId"] == str(ceo.agent.pk)
    record = patch(ceo, company, brandColor="#112233", logoAssetId=asset["assetId"]).json()
    assert (record["brandColor"], record["logoAssetId"]) == ("#112233", asset["assetId"])
    assert content_of(engineer.get(record["logoUrl"])) == PNG  # any agent of the company sees it
    assert_error(patch(ceo, company, budgetMonthlyCents=1), 403, "board_only")  # branding only


def test_a_viewer_cannot_upload(company):
    viewer = APIClient()
    viewer.force_login(MembershipFactory(company=company, role="viewer").user)
    assert_error(upload_logo(viewer, company), 403, "read_only_role")
    assert not Asset.objects.exists()


def test_only_non_empty_raster_images_within_the_limit_are_kept(board_client, company, settings):
    svg = b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'
    error = assert_error(upload_logo(board_client, company, "logo.svg", svg, "image/svg+xml"), 422,
                         "image_type_unsupported", fields=("file",))
    assert error["message"] == "Unsupported image type: image/svg+xml"
    assert_error(upload_logo(board_client, company, "notes.txt", b"hi", "text/plain"), 422, "image_type_unsupported")
    assert_error(upload_logo(board_client, company, "empty.png", b"", "image/png"), 422, "image_empty")
    assert_error(board_client.post(f"/api/companies/{company.pk}/logo", {}, format="multipart"), 400, "missing_file")
    settings.PAPERCLIP = {**settings.PAPERCLIP, "ATTACHMENT_MAX_BYTES": 100}
    assert_error(upload_logo(board_client, company), 422, "attachment_too_large", fields=("file",))
    assert not Asset.objects.exists()
    assert not attachment_storage().exists(f"{company.pk}/assets") or \
        attachment_storage().listdir(f"{company.pk}/assets")[1] == []
    # A JPEG named .jpg with a generic part type is recognised from its name (curl sends octet-stream).
    jpeg = upload_logo(board_client, company, "logo.jpg", b"\xff\xd8\xff\xe0 jpeg", "application/octet-stream")
    assert jpeg.status_code == 201 and jpeg.json()["contentType"] == "image/jpeg"


def test_another_companys_asset_is_a_404_as_a_logo_and_as_content(board_client, company):
    other = CompanyFactory()
    foreign = Asset.objects.get(pk=upload_logo(_owner_client(other), other).json()["assetId"])

    error = assert_error(patch(board_client, company, logoAssetId=str(foreign.pk)), 404, fields=("logoAssetId",))
    assert error["details"]["logoAssetId"] == ["No such asset in this company."]
    assert_error(patch(board_client, company, logoAssetId="00000000-0000-0000-0000-000000000000"), 404)
    assert Company.objects.get(pk=company.pk).logo_asset_id is None
    assert_error(board_client.get(foreign.content_path), 404)
    assert_error(board_client.post(f"/api/companies/{other.pk}/logo", {"file": a_file()}, format="multipart"), 404)


def test_the_bytes_go_with_the_company_and_the_sweep_keeps_only_named_ones(
        company, django_capture_on_commit_callbacks, own_attachment_storage):
    client = _owner_client(company)
    kept = Asset.objects.get(pk=upload_logo(client, company).json()["assetId"])
    storage = attachment_storage()
    orphan = storage.save(f"{company.pk}/assets/orphan", a_file())
    for key in (kept.object_key, orphan):
        os.utime(storage.path(key), (time.time() - 7200,) * 2)

    assert attachment_services.attachments_orphan_sweep(force=True) == 1
    assert storage.exists(kept.object_key) and not storage.exists(orphan)

    with django_capture_on_commit_callbacks(execute=True):
        Company.objects.get(pk=company.pk).delete()
    assert not storage.exists(kept.object_key)


def _owner_client(company):
    client = APIClient()
    client.force_login(MembershipFactory(company=company, role="owner").user)
    return client


def test_the_console_header_shows_the_current_companys_logo_and_color(board_client, board_user, company):
    from django.test import Client
    from django.urls import reverse

    asset = upload_logo(board_client, company).json()
    patch(board_client, company, logoAssetId=asset["assetId"], brandColor="#336699")
    console = Client()
    console.force_login(board_user)

    page = console.get(reverse("console:dashboard")).content.decode()

    assert f'<img class="company-logo" src="{asset["contentPath"]}" alt="{company.name} logo"' in page
    assert 'style="border-bottom: 3px solid #336699"' in page
    assert content_of(console.get(asset["contentPath"])) == PNG  # the console's session reads it
    plain = CompanyFactory()
    other_user = MembershipFactory(company=plain, role="owner").user
    console.force_login(other_user)
    page = console.get(reverse("console:dashboard")).content.decode()
    assert "company-logo" not in page and "3px solid" not in page


def test_a_replaced_or_cleared_logo_is_deleted_with_its_bytes(
        board_client, company, django_capture_on_commit_callbacks):
    first, second = (upload_logo(board_client, company).json()["assetId"] for _ in range(2))
    patch(board_client, company, logoAssetId=first)
    first_key = Asset.objects.get(pk=first).object_key

    with django_capture_on_commit_callbacks(execute=True):
        assert patch(board_client, company, logoAssetId=second).json()["logoAssetId"] == second

    assert not Asset.objects.filter(pk=first).exists() and not attachment_storage().exists(first_key)
    assert_error(board_client.get(f"/api/assets/{first}/content"), 404)
    with django_capture_on_commit_callbacks(execute=True):
        patch(board_client, company, logoAssetId=None)
    assert not Asset.objects.exists()


def test_bytes_of_an_upload_that_does_not_commit_are_removed(company, monkeypatch, own_attachment_storage):
    from issues.actors import SYSTEM
    from issues.services import assets as asset_services

    def fail(**kwargs):
        raise RuntimeError("audit write failed")

    monkeypatch.setattr(asset_services, "activity_record", fail)
    with pytest.raises(RuntimeError):
        asset_services.company_logo_upload(actor=SYSTEM, company=company, upload=a_file())
    folder = f"{company.pk}/assets"
    assert not Asset.objects.exists()
    assert not attachment_storage().exists(folder) or attachment_storage().listdir(folder)[1] == []
