"""The issue page's Attachments card in the operator console (Django test client, logged-in board
users): the list with its content links, the upload form (bytes stored and readable, the service's
422 reasons shown, nothing stored on a refusal), the confirmed delete, read-only viewers, and
another company's issue or attachment being a 404. The rules themselves are
issues/services/attachments.py's (tests/test_attachments.py)."""
import re

import pytest
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from issues import selectors
from issues.actors import Actor
from issues.models import ActivityLog, Attachment
from issues.services.attachments import attachment_create
from tests.attachment_files import PNG, a_file, stored_keys
from tests.factories import AgentFactory, CompanyFactory, IssueFactory, MembershipFactory
from tests.queries import count_page_queries

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
PDF = b"%PDF-1.4\n" + b"x" * 3000 + b"\n%%EOF\n"


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def text(response) -> str:
    return response.content.decode()


@pytest.fixture
def company():
    return CompanyFactory(name="Acme")


@pytest.fixture
def owner(company):
    return MembershipFactory(company=company, role="owner").user


@pytest.fixture
def issue(company):
    return IssueFactory(company=company, title="Ship the landing page")


@pytest.fixture
def client(owner):
    return login(owner)


def page_of(client, issue) -> str:
    response = client.get(reverse("console:issue-detail", args=[issue.identifier]))
    assert response.status_code == 200
    return text(response)


def card_of(page: str) -> str:
    match = re.search(r'<section class="card" aria-labelledby="attachments-h" id="attachments">.*?</section>', page,
                      re.S)
    assert match, "no Attachments card"
    return match.group(0)


def upload_url(issue) -> str:
    return reverse("console:issue-attachment-upload", args=[issue.identifier])


def delete_url(attachment) -> str:
    return reverse("console:attachment-delete", args=[attachment.pk])


# --- the card ---------------------------------------------------------------------------------------------


def test_the_card_lists_each_file_with_its_content_link_type_size_author_and_age(client, owner, company, issue):
    assert "No attachments." in card_of(page_of(client, issue))
    agent = AgentFactory(company=company, name="Linus")
    shot = attachment_create(actor=Actor(agent=agent), issue=issue, upload=a_file())
    report = attachment_create(actor=Actor(user=owner), issue=issue,
                               upload=a_file("report <q1>.pdf", PDF, "application/pdf"))

    card = card_of(page_of(client, issue))
    assert "No attachments." not in card
    # An image opens in a new tab (the content view shows it inline); a PDF is a download.
    assert f'<a href="/api/attachments/{shot.pk}/content" target="_blank" rel="noopener noreferrer">shot.png</a>' \
        in card
    assert f'<a href="/api/attachments/{report.pk}/content">report &lt;q1&gt;.pdf</a>' in card  # name escaped
    assert "<code>image/png</code> · 1.0\xa0KB" in card and "<code>application/pdf</code> · 2.9\xa0KB" in card
    assert f'<a href="{reverse("console:agent-detail", args=[agent.pk])}">Linus</a>' in card
    assert owner.get_username() in card and "ago</time>" in card
    assert card.index(f"attachment-{shot.pk}") < card.index(f"attachment-{report.pk}")  # oldest first


def test_the_content_link_serves_the_bytes_to_the_board_users_session(client, owner, issue):
    shot = attachment_create(actor=Actor(user=owner), issue=issue, upload=a_file())
    response = client.get(shot.content_path)
    assert response.status_code == 200 and response["Content-Type"] == "image/png"
    assert b"".join(response.streaming_content) == PNG


def test_the_page_reads_the_authors_in_a_constant_number_of_queries(client, owner, company, issue):
    url = reverse("console:issue-detail", args=[issue.identifier])

    def grow(n):
        for i in range(n):
            agent = AgentFactory(company=company)
            attachment_create(actor=Actor(agent=agent), issue=issue, upload=a_file(f"a{i}.png"))
            user = MembershipFactory(company=company, role="operator").user
            attachment_create(actor=Actor(user=user), issue=issue, upload=a_file(f"u{i}.txt", b"hi", "text/plain"))

    grow(1)
    small = count_page_queries(client, url)
    grow(4)
    assert count_page_queries(client, url) == small


# --- upload -----------------------------------------------------------------------------------------------


def test_uploading_through_the_form_stores_the_file_and_shows_it(client, owner, issue):
    card = card_of(page_of(client, issue))
    assert f'action="{upload_url(issue)}" enctype="multipart/form-data"' in card and 'name="file"' in card

    response = client.post(upload_url(issue), {"file": a_file("notes.txt", b"remember the milk\n", "text/plain")})
    assert response.status_code == 302
    assert response["Location"] == reverse("console:issue-detail", args=[issue.identifier]) + "#attachments"

    attachment = Attachment.objects.get(issue=issue)
    assert (attachment.original_filename, attachment.content_type, attachment.byte_size) == \
        ("notes.txt", "text/plain", 18)
    assert (attachment.author_type, attachment.author_user_id) == ("user", owner.pk)
    assert selectors.attachment_content(attachment).read() == b"remember the milk\n"
    assert stored_keys(issue) == {attachment.object_key}
    assert ActivityLog.objects.filter(action="issue.attachment_added", entity_id=str(issue.pk)).count() == 1

    page = page_of(client, issue)
    assert "Attached “notes.txt”." in page
    assert f'<a href="{attachment.content_path}" target="_blank" rel="noopener noreferrer">notes.txt</a>' in page


def test_an_htmx_upload_lands_back_on_the_page(client, issue):
    response = client.post(upload_url(issue), {"file": a_file()}, follow=True, **HTMX)
    assert response.status_code == 200
    page = text(response)
    assert 'id="issue-main"' in page and "Attached “shot.png”." in page
    assert Attachment.objects.filter(issue=issue, original_filename="shot.png").exists()


@pytest.mark.parametrize("upload, reason", [
    (a_file("tool.exe", b"MZ\x90\x00", "application/x-msdownload"),
     "Unsupported attachment type: application/x-msdownload — file: 'application/x-msdownload' is not an "
     "accepted type."),
    (a_file("empty.txt", b"", "text/plain"), "Attachment is empty — file: The file has no bytes."),
], ids=["unsupported-type", "empty"])
def test_a_refused_file_shows_the_reason_and_stores_nothing(client, issue, upload, reason):
    response = client.post(upload_url(issue), {"file": upload}, follow=True)
    assert response.status_code == 200
    assert escape(reason) in text(response) and 'class="flash flash-error"' in text(response)
    assert not Attachment.objects.filter(issue=issue).exists() and stored_keys(issue) == set()
    assert not ActivityLog.objects.filter(action="issue.attachment_added").exists()


def test_an_oversized_file_is_refused_with_the_limit(client, issue, settings):
    # The test client sends no CSRF field for the middleware to read: the view parses the body itself
    # (as with htmx, whose token travels in a header), and only then knows the file was dropped.
    settings.PAPERCLIP = {**settings.PAPERCLIP, "ATTACHMENT_MAX_BYTES": 100}
    page = text(client.post(upload_url(issue), {"file": a_file()}, follow=True))
    assert "Attachment exceeds 100 bytes — file: The limit is 100 bytes." in page
    assert not Attachment.objects.filter(issue=issue).exists() and stored_keys(issue) == set()
    assert "One file, up to 100\xa0bytes." in page  # the form says the limit


@pytest.mark.parametrize("token_in", ["form", "header"])
def test_an_oversized_file_is_refused_whoever_parses_the_body_first(owner, issue, settings, token_in):
    """The CSRF middleware reads a token sent as a form field (parsing the body before the view);
    htmx sends it as a header (the view parses the body). Either way the dropped file is refused."""
    settings.PAPERCLIP = {**settings.PAPERCLIP, "ATTACHMENT_MAX_BYTES": 100}
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(owner)
    page_of(strict, issue)  # sets the CSRF cookie
    token = strict.cookies["csrftoken"].value
    data, headers = {"file": a_file()}, {}
    if token_in == "form":
        data["csrfmiddlewaretoken"] = token
    else:
        headers = {"HTTP_X_CSRFTOKEN": token, **HTMX}
    page = text(strict.post(upload_url(issue), data, follow=True, **headers))
    assert "Attachment exceeds 100 bytes — file: The limit is 100 bytes." in page
    assert not Attachment.objects.filter(issue=issue).exists() and stored_keys(issue) == set()


def test_a_post_without_a_file_asks_for_one(client, issue):
    page = text(client.post(upload_url(issue), {}, follow=True))
    assert "Missing file field &#x27;file&#x27; — file: Send the file as the multipart field &#x27;file&#x27;." in page
    assert not Attachment.objects.filter(issue=issue).exists()


# --- delete -----------------------------------------------------------------------------------------------


def test_delete_is_confirmed_in_the_page_and_removes_the_row_and_its_bytes(
        client, owner, issue, django_capture_on_commit_callbacks):
    attachment = attachment_create(actor=Actor(user=owner), issue=issue, upload=a_file())
    card = card_of(page_of(client, issue))
    # A second step without a JavaScript dialog, as the page's other destructive actions.
    assert re.search(r'<details class="attachment-delete"><summary class="small">Delete…</summary>\s*'
                     rf'<form method="post" action="{delete_url(attachment)}"', card)
    assert "Confirm delete</button>" in card

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(delete_url(attachment))
    assert response.status_code == 302
    assert response["Location"] == reverse("console:issue-detail", args=[issue.identifier]) + "#attachments"
    assert not Attachment.objects.filter(pk=attachment.pk).exists() and stored_keys(issue) == set()
    assert ActivityLog.objects.filter(action="issue.attachment_removed", entity_id=str(issue.pk)).count() == 1
    page = page_of(client, issue)
    assert "Deleted “shot.png”." in page and "No attachments." in card_of(page)


def test_delete_is_post_only_and_csrf_protected(owner, issue):
    attachment = attachment_create(actor=Actor(user=owner), issue=issue, upload=a_file())
    assert login(owner).get(delete_url(attachment)).status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(owner)
    assert strict.post(delete_url(attachment)).status_code == 403
    assert strict.post(upload_url(issue), {"file": a_file("other.png")}).status_code == 403
    assert list(Attachment.objects.filter(issue=issue)) == [attachment]


# --- who may ----------------------------------------------------------------------------------------------


def test_a_viewer_sees_the_files_but_no_forms_and_is_refused(company, owner, issue):
    attachment = attachment_create(actor=Actor(user=owner), issue=issue, upload=a_file())
    viewer = login(MembershipFactory(company=company, role="viewer").user)
    card = card_of(page_of(viewer, issue))
    assert attachment.content_path in card
    assert "<form" not in card and upload_url(issue) not in card and delete_url(attachment) not in card

    response = viewer.post(upload_url(issue), {"file": a_file("mine.png")})
    assert response.status_code == 403 and "Not allowed" in text(response)
    response = viewer.post(delete_url(attachment))
    assert response.status_code == 403
    assert list(Attachment.objects.filter(issue=issue)) == [attachment]
    assert stored_keys(issue) == {attachment.object_key}


def test_an_operator_may_upload_and_delete(company, issue, django_capture_on_commit_callbacks):
    operator = login(MembershipFactory(company=company, role="operator").user)
    assert operator.post(upload_url(issue), {"file": a_file()}).status_code == 302
    attachment = Attachment.objects.get(issue=issue)
    with django_capture_on_commit_callbacks(execute=True):
        assert operator.post(delete_url(attachment)).status_code == 302
    assert not Attachment.objects.filter(issue=issue).exists()


def test_another_companys_issue_and_attachment_are_404(owner, issue):
    attachment = attachment_create(actor=Actor(user=owner), issue=issue, upload=a_file())
    stranger = login(MembershipFactory(company=CompanyFactory(), role="owner").user)
    assert stranger.get(reverse("console:issue-detail", args=[issue.identifier])).status_code == 404
    assert stranger.post(upload_url(issue), {"file": a_file("theirs.png")}).status_code == 404
    assert stranger.post(delete_url(attachment)).status_code == 404
    assert stranger.get(attachment.content_path).status_code == 404
    assert stranger.post(reverse("console:attachment-delete", args=["00000000-0000-0000-0000-000000000000"])) \
        .status_code == 404
    assert list(Attachment.objects.filter(issue=issue)) == [attachment]
    assert stored_keys(issue) == {attachment.object_key}
