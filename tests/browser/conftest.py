"""Real-browser tests: Python Playwright drives the OS Chromium against pytest-django's live server.

The browser is the system package (``/usr/bin/chromium``, installed by ``.ci/run`` when missing);
Playwright never downloads one. Each xdist worker has its own live server and test database.

Playwright's sync API keeps an asyncio loop running in this thread while it is started, and
Django refuses ORM calls from a thread with a running loop; the tests set up data with the ORM,
so ``DJANGO_ALLOW_ASYNC_UNSAFE`` is set only while the browser of a module is up (Playwright is
stopped, and the variable restored, when the module ends, so other tests keep the check).
"""
import os
import shutil

import pytest

from tests.factories import TEST_PASSWORD

os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
DEFAULT_TIMEOUT_MS = 10_000


def chromium_path() -> str:
    for candidate in (os.environ.get("PAPERCLIP_CHROMIUM"), *CHROMIUM_CANDIDATES, shutil.which("chromium")):
        if candidate and os.path.exists(candidate):
            return candidate
    pytest.fail("No system Chromium found: install the OS package (apt-get install chromium); "
                "the browser tests never download a browser.")


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/browser/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    playwright = sync_playwright().start()
    try:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        yield browser
        browser.close()
    finally:
        playwright.stop()
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def page(browser, live_server, tmp_path, request):
    """A fresh browser context (no cookies) per test; a screenshot of the last page is kept in the
    test's tmp_path as an artifact. A JavaScript dialog (alert) fails the test."""
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(DEFAULT_TIMEOUT_MS)
    page = context.new_page()
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    try:
        page.screenshot(path=str(tmp_path / f"{request.node.name}.png"), full_page=True)
    finally:
        context.close()
    assert not dialogs, f"a page opened a dialog: {dialogs}"
    assert not errors, f"JavaScript errors: {errors}"


def log_in(page, user, next_url="/dashboard/"):
    page.goto(f"/accounts/login/?next={next_url}")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(TEST_PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"**{next_url}")
