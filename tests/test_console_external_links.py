"""Stored XSS through tracker URLs: a ``javascript:`` URL in a signed tracker payload is neither stored
(every adapter keeps a task/comment URL only when it is an absolute http(s) URL) nor rendered as a link
(the console's ``web_link`` filter, for rows stored before the adapters filtered). External comment
authors show their name, not the provenance dict."""
import json
import re
from pathlib import Path

import pytest
from django.urls import reverse

from connectors import sandbox as sandbox_pkg
from connectors.choices import ConflictKind
from connectors.models import Conflict, TaskLink
from connectors.providers.asana import normalize as asana_normalize
from connectors.providers.base import AdapterConfig
from connectors.providers.github import GitHubIssuesAdapter
from connectors.providers.jira import JiraAdapter
from connectors.providers.linear import LinearAdapter
from connectors.providers.trello import TrelloAdapter
from issues.models import Comment, WorkProduct
from paperclip.core.links import web_url
from paperclip.core.templatetags.console import web_link
from tests.github_sandbox import DEFAULT_STATE_MAPPING
from tests.notion_sandbox import notion_adapter_for
from tests.test_connectors_github import agents, deliver, fixture_body, instance  # noqa: F401  (fixtures)

SCRIPT = "javascript:alert(document.cookie)//"
FIXTURES = Path(sandbox_pkg.__file__).resolve().parent / "fixtures"  # ../shared/fixtures/providers, copied unchanged


@pytest.fixture
def console(board_client):
    return board_client  # a board user's session: console pages, as the API


def hrefs(response) -> list[str]:
    return re.findall(r'href="([^"]*)"', response.content.decode())


def shared_fixture(path: str) -> dict:
    """A real provider payload; tests change only its URL fields."""
    return json.loads((FIXTURES / path).read_text())


def script_delivery(instance, capture):
    """The real ``issue_comment`` delivery, signed, with only the URL fields replaced by script URLs."""
    payload = json.loads(fixture_body("issue_comment_created"))
    payload["issue"]["html_url"] = SCRIPT
    payload["comment"]["html_url"] = "javascript:alert('comment')//"
    answer = deliver(instance, "issue_comment_created", capture, body=json.dumps(payload).encode())
    assert answer.status_code == 202, answer.content
    return TaskLink.objects.get(instance=instance)


# --- through the real webhook endpoint ---------------------------------------------------------------------
def test_a_script_url_in_a_github_delivery_is_not_stored_nor_linked(instance, agents, console,
                                                                    django_capture_on_commit_callbacks):
    link = script_delivery(instance, django_capture_on_commit_callbacks)
    comment = Comment.objects.get(issue=link.issue, provenance__kind="external_comment")
    assert link.external_url == "" and comment.provenance["url"] == ""
    assert "javascript:" not in comment.body and "javascript:" not in link.issue.description
    page = console.get(reverse("console:issue-detail", args=[link.issue.identifier]))
    assert page.status_code == 200
    assert not [h for h in hrefs(page) if not h.startswith(("/", "#", "?", "http://", "https://"))]
    assert "javascript:" not in page.content.decode()
    # the link panel still names the task, as text
    assert f"{link.external_key}</strong>" in page.content.decode()


def test_external_comment_author_shows_the_login_not_the_provenance_dict(instance, agents, console,
                                                                         django_capture_on_commit_callbacks):
    deliver(instance, "issue_comment_created", django_capture_on_commit_callbacks)
    link = TaskLink.objects.get(instance=instance)
    html = console.get(reverse("console:issue-detail", args=[link.issue.identifier])).content.decode()
    assert "<strong>Codertocat</strong>" in html and "externalUserId" not in html
    assert "external · github_issues" in html
    # the real URL stays a link
    comment = Comment.objects.get(issue=link.issue, provenance__kind="external_comment")
    assert comment.provenance["url"].startswith("https://github.com/")
    assert f'href="{comment.provenance["url"]}"' in html and f'href="{link.external_url}"' in html


def test_an_author_without_a_name_falls_back_to_the_user_id_then_a_word(instance, agents, console,
                                                                        django_capture_on_commit_callbacks):
    deliver(instance, "issue_comment_created", django_capture_on_commit_callbacks)
    link = TaskLink.objects.get(instance=instance)
    comment = Comment.objects.get(issue=link.issue, provenance__kind="external_comment")
    url = reverse("console:issue-detail", args=[link.issue.identifier])
    comment.provenance["actor"]["displayName"] = ""
    Comment.objects.filter(pk=comment.pk).update(provenance=comment.provenance)
    assert "<strong>21031067</strong>" in console.get(url).content.decode()
    comment.provenance["actor"] = None
    Comment.objects.filter(pk=comment.pk).update(provenance=comment.provenance)
    assert "<strong>external user</strong>" in console.get(url).content.decode()


def test_script_urls_stored_before_the_fix_render_as_text(instance, agents, console,
                                                          django_capture_on_commit_callbacks):
    """Rows written before the adapters filtered URLs (or by any other path): no page links them."""
    deliver(instance, "issue_comment_created", django_capture_on_commit_callbacks)
    link = TaskLink.objects.get(instance=instance)
    TaskLink.objects.filter(pk=link.pk).update(external_url=SCRIPT)  # update(): validators never ran on save
    comment = Comment.objects.get(issue=link.issue, provenance__kind="external_comment")
    Comment.objects.filter(pk=comment.pk).update(provenance={**comment.provenance, "url": "JavaScript:alert(2)"})
    WorkProduct.objects.create(company=link.company, issue=link.issue, kind="pull_request", title="the fix",
                               url="data:text/html,<script>alert(3)</script>")
    Conflict.objects.create(company=link.company, instance=instance, link=link, kind=ConflictKind.FIELD,
                            field="title", external_value="a", paperclip_value="b")
    for url in (reverse("console:issue-detail", args=[link.issue.identifier]),
                reverse("connectors_console:conflict-list")):
        page = console.get(url)
        assert page.status_code == 200, url
        bad = [h for h in hrefs(page) if h.lower().startswith(("javascript:", "data:"))]
        assert not bad, (url, bad)
        assert link.external_key in page.content.decode()
    assert "the fix" in console.get(reverse("console:issue-detail", args=[link.issue.identifier])).content.decode()


def test_console_admin_and_api_docs_pages_carry_a_script_self_csp(console, issue, board_user):
    page = console.get(reverse("console:issue-detail", args=[issue.identifier]))
    policy = page["Content-Security-Policy"]
    assert "script-src 'self';" in policy and "object-src 'none'" in policy and "unsafe-eval" not in policy
    assert "unsafe-inline" not in policy.split("script-src", 1)[1].split(";", 1)[0]
    # what the policy allows is what the page uses: its scripts are same-origin files, none inline
    html = page.content.decode()
    assert re.findall(r"<script(?![^>]*\bsrc=\"/static/)", html) == []
    assert " onclick=" not in html and "hx-on" not in html
    partial = console.get(reverse("console:issue-list"), HTTP_HX_REQUEST="true")
    assert partial.status_code == 200 and "Content-Security-Policy" in partial
    board_user.is_staff = board_user.is_superuser = True
    board_user.save()
    assert console.get("/admin/")["Content-Security-Policy"] == policy
    docs = console.get(reverse("api-docs"))
    assert "script-src 'self';" in docs["Content-Security-Policy"] and "connect-src 'self'" in docs["Content-Security-Policy"]
    assert re.findall(r"<script(?![^>]*\bsrc=)", docs.content.decode()) == []  # the start script is a file
    assert re.findall(r"<script(?![^>]*\bsrc=)", console.get(reverse("api-redoc")).content.decode()) == []
    assert "Content-Security-Policy" not in console.get(reverse("schema"))  # JSON, not a page


# --- the one rule and the filter -------------------------------------------------------------------------
@pytest.mark.parametrize("value, kept", [
    ("https://github.com/o/r/issues/1", True), ("http://lfranchi.com:8080/browse/BUG-15", True),
    ("HTTPS://EXAMPLE.COM/x", True), (SCRIPT, False), ("JavaScript:alert(1)", False), (" javascript:x", False),
    ("data:text/html,x", False), ("vbscript:x", False), ("//evil.example/x", False), ("/issues/PC-1", False),
    ("https:evil", False), ("mailto:a@b.c", False), ("https://x\n", False), ("", False), (None, False), (3, False),
])
def test_web_url_keeps_only_absolute_http_urls(value, kept):
    assert web_url(value) == (value if kept else "")
    assert web_link(value) == (value if kept else "")


# --- each provider's normalisation -------------------------------------------------------------------------
def config(base_url, **kw):
    return AdapterConfig(base_url=base_url, containers=kw.pop("containers", ()), state_mapping=kw.pop("mapping", {}),
                         credentials="x", webhook_secret="s", **kw)


def test_github_normalisation_drops_script_urls():
    adapter = GitHubIssuesAdapter(config("https://api.github.com", containers=("Codertocat/Hello-World",),
                                         mapping=DEFAULT_STATE_MAPPING))
    payload = json.loads(fixture_body("issue_comment_created"))
    good_task, good_comment = payload["issue"]["html_url"], payload["comment"]["html_url"]
    assert adapter.normalize_issue(payload["issue"], payload["repository"]).url == good_task
    assert adapter.normalize_comment(payload["comment"], "1").url == good_comment
    payload["issue"]["html_url"], payload["comment"]["html_url"] = SCRIPT, SCRIPT
    assert adapter.normalize_issue(payload["issue"], payload["repository"]).url == ""
    assert adapter.normalize_comment(payload["comment"], "1").url == ""


def test_linear_normalisation_drops_script_urls():
    adapter = LinearAdapter(config("https://api.linear.app", containers=("LIN",), mapping=DEFAULT_STATE_MAPPING))
    issue, comment = shared_fixture("linear/lhc_linearIssueCreated.json"), shared_fixture("linear/lhc_linearCommentCreated.json")
    assert adapter.normalize_issue(issue["data"], url=issue["url"]).url == issue["url"]
    assert adapter.normalize_comment(comment["data"], "t", url=comment["url"]).url == comment["url"]
    assert adapter.normalize_issue({**issue["data"], "url": SCRIPT}, url=SCRIPT).url == ""
    assert adapter.normalize_comment({**comment["data"], "url": SCRIPT}, "t", url=SCRIPT).url == ""
    assert adapter.normalize_issue(issue["data"], url=SCRIPT).url == ""  # the delivery's own url, no data.url


def test_jira_normalisation_builds_urls_on_an_http_base_only():
    adapter = JiraAdapter(config("https://zulipintegrations.atlassian.net", containers=("BUG", "ZUL"),
                                 mapping={"To Do": "backlog", "In Progress": "active", "Done": "terminal"}))
    issue = shared_fixture("jira/zulip_issue_created.json")["issue"]
    assert adapter.normalize_issue(issue).url == "http://lfranchi.com:8080/browse/BUG-15"
    scripted = adapter.normalize_issue({**issue, "self": SCRIPT + "https://x/"})
    assert scripted.url == "https://zulipintegrations.atlassian.net/browse/BUG-15"  # the instance's base, not the payload's
    comment = shared_fixture("jira/zulip_comment_created.json")["comment"]
    kept = adapter.normalize_comment({**comment, "self": SCRIPT}, "t", issue_key="ZUL-1", issue_self=SCRIPT)
    assert kept.url.startswith("https://zulipintegrations.atlassian.net/browse/ZUL-1?")


def test_trello_normalisation_drops_script_urls():
    adapter = TrelloAdapter(config("https://api.trello.com/1", containers=("53582e2da0fac5676a714277",)))
    card = shared_fixture("trello/zulip_changing_cards_list.json")["action"]["data"]["card"]
    assert adapter.normalize_card(card).url == f"https://trello.com/c/{card['shortLink']}"
    assert adapter.normalize_card({**card, "url": SCRIPT}).url == ""
    assert adapter.normalize_card({**card, "shortUrl": SCRIPT}).url == ""
    action = shared_fixture("trello/zulip_adding_comment_to_card.json")["action"]
    assert web_url(adapter.normalize_comment(action).url)


def test_notion_normalisation_drops_script_urls(notion_sandbox):
    adapter = notion_adapter_for(notion_sandbox)
    page = notion_sandbox.add_page("Fix the login", database=notion_sandbox.tasks["id"], status="In progress")
    assert adapter.normalize_page(page).url == page["url"] and page["url"].startswith("https://")
    assert adapter.normalize_page({**page, "url": SCRIPT}).url == ""
    comment = notion_sandbox.add_comment(page["id"], "Seen on 2.3 too")
    assert adapter.normalize_comment(comment, page["id"], page_url=page["url"]).url.startswith(page["url"])
    assert adapter.normalize_comment(comment, page["id"], page_url=SCRIPT).url == ""


def test_asana_normalisation_drops_script_urls():
    from connectors.providers.asana import AsanaAdapter

    adapter = AsanaAdapter(config("https://app.asana.com/api/1.0", containers=("1201",)))
    raw = {"gid": "1201000000000101", "name": "Fix login", "completed": False,
           "memberships": [{"project": {"gid": "1201"}, "section": {"gid": "9", "name": "To do"}}],
           "permalink_url": "https://app.asana.com/0/1201/1201000000000101"}
    assert adapter.normalize_task(raw).url == raw["permalink_url"]
    assert adapter.normalize_task({**raw, "permalink_url": SCRIPT}).url == ""
    story = {"gid": "77", "resource_subtype": "comment_added", "text": "hi", "created_by": {"gid": "5", "name": "Carol"},
             "created_at": "2026-01-01T00:00:00Z"}
    kw = {"service_account_id": None}
    assert asana_normalize.comment(story, raw["gid"], task_url=raw["permalink_url"], **kw).url == raw["permalink_url"]
    assert asana_normalize.comment(story, raw["gid"], task_url=SCRIPT, **kw).url == ""
