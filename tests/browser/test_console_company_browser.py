"""The console's Company page in headless Chromium: an admin uploads a logo and sets the brand
colour, and the header shows both — the logo image loads under the console's
Content-Security-Policy (an ``<img>`` whose bytes come from the API's sandboxed asset view)."""
import struct
import zlib

import pytest
from playwright.sync_api import expect

from issues.models import Company
from tests.factories import CompanyFactory, MembershipFactory

from .conftest import log_in

pytestmark = pytest.mark.django_db(transaction=True)


def tiny_png() -> bytes:
    """A real 1x1 PNG, so the browser decodes it (naturalWidth 1)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 6, 0, 0, 0)  # 1x1, 8-bit RGBA
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00\x33\x66\x99\xff"))
            + chunk(b"IEND", b""))


def test_an_admin_brands_the_company_and_the_header_shows_it(page):
    company = CompanyFactory(name="Acme Robotics")
    admin = MembershipFactory(company=company, role="admin").user
    refused = []
    page.on("console", lambda message: refused.append(message.text)
            if "Content Security Policy" in message.text or "Refused to" in message.text else None)

    log_in(page, admin, "/dashboard/")
    page.get_by_role("link", name="Company").click()
    page.get_by_label("PNG, JPEG, GIF or WebP").set_input_files(
        {"name": "logo.png", "mimeType": "image/png", "buffer": tiny_png()})
    page.get_by_role("button", name="Upload logo").click()
    expect(page.locator("#messages")).to_contain_text("Logo updated.")
    page.get_by_label("Brand colour").fill("#336699")
    page.get_by_role("button", name="Save").click()
    expect(page.locator("#messages")).to_contain_text("Company settings saved.")

    logo = page.locator("header img.company-logo")
    expect(logo).to_have_attribute("alt", "Acme Robotics logo")
    page.wait_for_function("document.querySelector('header img.company-logo').complete")
    assert page.evaluate("document.querySelector('header img.company-logo').naturalWidth") == 1
    assert Company.objects.get(pk=company.pk).brand_color == "#336699"
    assert "rgb(51, 102, 153)" in page.evaluate("getComputedStyle(document.querySelector('header.topbar'))"
                                                ".borderBottomColor")
    assert refused == []
