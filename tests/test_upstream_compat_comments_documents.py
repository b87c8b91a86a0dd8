"""Upstream's contract (ref §5.2) for the thread read, document writes and issue create/PATCH input:
``GET …/comments`` newest first unless ``order=asc``, ``afterCommentId``, ``limit`` 1-500 (none = all);
``PUT …/documents/{key}`` with ``changeSummary``, ``title: null`` and a case-insensitive key; a null
``description``, a PATCH ``assigneeAgentId`` given as the agent's shortname, and the create default
status (todo with an assignee, else backlog)."""
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from issues.models import Comment, DocumentRevision, Issue, WakeupRequest
from tests.factories import AgentFactory, CompanyFactory, IssueFactory
from tests.queries import count_queries
from tests.test_errors import assert_error


def thread(issue, n):
    """``n`` comments one minute apart, oldest first."""
    start = timezone.now() - timedelta(hours=1)
    comments = []
    for i in range(n):
        comment = Comment.objects.create(company=issue.company, issue=issue, author_type="system", body=f"c{i}")
        Comment.objects.filter(pk=comment.pk).update(created_at=start + timedelta(minutes=i))
        comments.append(comment)
    return comments


def bodies(client, issue, query=""):
    response = client.get(f"/api/issues/{issue.pk}/comments{query}")
    assert response.status_code == 200, response.content[:500]
    return [c["body"] for c in response.json()]


# --- comments ---------------------------------------------------------------------------------------------


def test_comments_are_newest_first_unless_order_asc(board_client, issue):
    thread(issue, 3)
    assert bodies(board_client, issue) == ["c2", "c1", "c0"]
    assert bodies(board_client, issue, "?order=desc") == ["c2", "c1", "c0"]
    assert bodies(board_client, issue, "?order=sideways") == ["c2", "c1", "c0"]
    assert bodies(board_client, issue, "?order=asc") == ["c0", "c1", "c2"]


def test_after_comment_id_is_an_alias_of_after(board_client, issue):
    first, *_ = thread(issue, 4)
    assert bodies(board_client, issue, f"?afterCommentId={first.pk}&order=asc") == ["c1", "c2", "c3"]
    assert bodies(board_client, issue, f"?after={first.pk}&order=asc") == ["c1", "c2", "c3"]
    # Newer than the anchor, newest first without order=asc.
    assert bodies(board_client, issue, f"?afterCommentId={first.pk}") == ["c3", "c2", "c1"]
    assert_error(board_client.get(f"/api/issues/{issue.pk}/comments?afterCommentId=yesterday"), 400,
                 fields=["afterCommentId"])


def test_without_limit_every_comment_is_returned(board_client, issue, monkeypatch):
    monkeypatch.setitem(settings.PAPERCLIP, "API_LIST_DEFAULT_LIMIT", 2)  # not the thread's bound
    thread(issue, 3)
    assert bodies(board_client, issue, "?order=asc") == ["c0", "c1", "c2"]
    assert bodies(board_client, issue, "?order=asc&limit=2") == ["c0", "c1"]
    assert bodies(board_client, issue, "?limit=1") == ["c2"]


def test_limit_is_clamped_to_500_and_below_1_is_a_400(board_client, issue):
    Comment.objects.bulk_create([Comment(company=issue.company, issue=issue, author_type="system", body=str(i))
                                 for i in range(501)])
    assert len(board_client.get(f"/api/issues/{issue.pk}/comments?limit=501").json()) == 500
    assert len(board_client.get(f"/api/issues/{issue.pk}/comments").json()) == 501
    assert_error(board_client.get(f"/api/issues/{issue.pk}/comments?limit=0"), 400, fields=["limit"])


def test_the_newest_first_thread_is_a_constant_number_of_queries(board_client, company):
    small, large = IssueFactory(company=company), IssueFactory(company=company)
    agent = AgentFactory(company=company)
    thread(small, 1)
    for comment in thread(large, 6):
        Comment.objects.filter(pk=comment.pk).update(author_type="agent", author_agent=agent)
    few, _ = count_queries(board_client, f"/api/issues/{small.pk}/comments")
    many, listed = count_queries(board_client, f"/api/issues/{large.pk}/comments")
    assert few == many
    assert [c["body"] for c in listed] == ["c5", "c4", "c3", "c2", "c1", "c0"]


# --- documents --------------------------------------------------------------------------------------------


def put(client, issue, key, **body):
    return client.put(f"/api/issues/{issue.pk}/documents/{key}", {"format": "markdown", **body}, format="json")


def test_change_summary_is_stored_on_the_revision_and_listed(board_client, issue):
    first = put(board_client, issue, "plan", title="Plan", body="v1", changeSummary="First draft")
    assert first.status_code == 201, first.content
    second = put(board_client, issue, "plan", title="Plan", body="v2", baseRevisionId=first.json()["revisionId"])
    assert second.status_code == 200, second.content
    assert DocumentRevision.objects.get(pk=first.json()["revisionId"]).change_summary == "First draft"
    revisions = board_client.get(f"/api/issues/{issue.pk}/documents/plan/revisions").json()
    assert [(r["body"], r["changeSummary"]) for r in revisions] == [("v1", "First draft"), ("v2", None)]
    too_long = put(board_client, issue, "plan", body="v3", changeSummary="x" * 501,
                   baseRevisionId=second.json()["revisionId"])
    assert_error(too_long, 400, fields=["changeSummary"])


def test_a_null_title_and_change_summary_are_accepted(board_client, issue):
    first = put(board_client, issue, "notes", title="Notes", body="v1", changeSummary=None)
    assert first.status_code == 201, first.content
    untitled = put(board_client, issue, "notes", title=None, body="v2", baseRevisionId=first.json()["revisionId"])
    assert untitled.status_code == 200, untitled.content
    assert untitled.json()["title"] == ""


def test_document_keys_are_case_insensitive(board_client, issue):
    created = put(board_client, issue, "PLAN", title="Plan", body="v1")
    assert created.status_code == 201, created.content
    assert created.json()["key"] == "plan"
    for key in ("plan", "PLAN", "Plan"):
        got = board_client.get(f"/api/issues/{issue.pk}/documents/{key}")
        assert got.status_code == 200 and got.json()["body"] == "v1"
    updated = put(board_client, issue, "plan", body="v2", baseRevisionId=created.json()["revisionId"])
    assert updated.status_code == 200 and issue.documents.count() == 1
    assert len(board_client.get(f"/api/issues/{issue.pk}/documents/Plan/revisions").json()) == 2
    # Lower-casing does not make a bad key good.
    assert_error(put(board_client, issue, "PLAN!", body="x"), 400, fields=["key"])


# --- issue create and PATCH input --------------------------------------------------------------------------


def create(client, company, **body):
    return client.post(f"/api/companies/{company.pk}/issues", body, format="json")


def test_created_issue_defaults_to_backlog_without_an_assignee_and_todo_with_one(board_client, company):
    agent = AgentFactory(company=company)
    loose = create(board_client, company, title="Someday")
    assert loose.status_code == 201 and loose.json()["status"] == "backlog"
    assigned = create(board_client, company, title="Now", assigneeAgentId=str(agent.pk))
    assert assigned.status_code == 201 and assigned.json()["status"] == "todo"
    explicit = create(board_client, company, title="Chosen", status="todo")
    assert explicit.json()["status"] == "todo"
    child = board_client.post(f"/api/issues/{loose.json()['id']}/children", {"title": "Part"}, format="json")
    assert child.status_code == 201 and child.json()["status"] == "backlog"
    # the assignee is woken (issue_assigned) unless the issue is created in backlog
    parked = create(board_client, company, title="Later", assigneeAgentId=str(agent.pk), status="backlog")
    assert parked.status_code == 201 and parked.json()["status"] == "backlog"
    woken = set(WakeupRequest.objects.filter(agent=agent, reason="issue_assigned").values_list("issue_id", flat=True))
    assert {str(pk) for pk in woken} == {assigned.json()["id"]}


def test_description_may_be_null_on_create_and_patch(board_client, company):
    created = create(board_client, company, title="No words", description=None)
    assert created.status_code == 201, created.content
    assert created.json()["description"] == ""
    issue = Issue.objects.get(pk=created.json()["id"])
    issue.description = "Some words"
    issue.save()
    patched = board_client.patch(f"/api/issues/{issue.pk}", {"description": None}, format="json")
    assert patched.status_code == 200, patched.content
    assert patched.json()["description"] == "" and Issue.objects.get(pk=issue.pk).description == ""


def test_patch_assignee_by_shortname_resolves_in_the_issue_company(board_client, company, issue):
    ada = AgentFactory(company=company, name="Ada Lovelace")
    for ref in ("ada-lovelace", "Ada-Lovelace"):
        Issue.objects.filter(pk=issue.pk).update(assignee_agent=None)
        response = board_client.patch(f"/api/issues/{issue.pk}", {"assigneeAgentId": ref}, format="json")
        assert response.status_code == 200, response.content
        assert response.json()["assigneeAgentId"] == str(ada.pk)
    # Another company's agent of that shortname is not found here, as its id would not be.
    stranger = AgentFactory(company=CompanyFactory(), name="Grace Hopper")
    assert_error(board_client.patch(f"/api/issues/{issue.pk}", {"assigneeAgentId": "grace-hopper"}, format="json"),
                 404, fields=["assigneeAgentId"])
    assert_error(board_client.patch(f"/api/issues/{issue.pk}", {"assigneeAgentId": str(stranger.pk)},
                                    format="json"), 404, fields=["assigneeAgentId"])
    for bad in (123, ""):  # a reference is a non-empty string
        assert_error(board_client.patch(f"/api/issues/{issue.pk}", {"assigneeAgentId": bad}, format="json"), 400,
                     fields=["assigneeAgentId"])
    assert Issue.objects.get(pk=issue.pk).assignee_agent_id == ada.pk


def test_an_ambiguous_shortname_is_a_409(board_client, company, issue):
    AgentFactory(company=company, name="Ada L")
    AgentFactory(company=company, name="ada-l")
    response = board_client.patch(f"/api/issues/{issue.pk}", {"assigneeAgentId": "ada-l"}, format="json")
    assert_error(response, 409, "agent_shortname_ambiguous", fields=["assigneeAgentId"])
    assert response.json()["error"] == "Agent shortname is ambiguous in this company. Use the agent ID."


def test_a_comment_body_is_stored_as_sent(board_client, issue):
    """Markdown keeps its leading indentation (an indented code block) and trailing newline, through
    POST /comments and PATCH's comment alike."""
    body = "    indented code\n\n- item\n"
    posted = board_client.post(f"/api/issues/{issue.pk}/comments", {"body": body}, format="json")
    assert posted.status_code == 201 and posted.json()["body"] == body
    patched = board_client.patch(f"/api/issues/{issue.pk}", {"comment": body, "priority": "high"}, format="json")
    assert patched.status_code == 200 and patched.json()["comment"]["body"] == body
    assert list(Comment.objects.filter(issue=issue).values_list("body", flat=True)) == [body, body]
    blank = board_client.post(f"/api/issues/{issue.pk}/comments", {"body": "   "}, format="json")
    assert_error(blank, 400, fields=["body"])


def test_children_take_their_blockers_from_the_create_body(board_client, company, issue):
    """POST /api/issues/:id/children takes the create fields minus parentId, blockedByIssueIds too."""
    first = IssueFactory(company=company, title="First part")
    child = board_client.post(f"/api/issues/{issue.pk}/children",
                              {"title": "Second part", "blockedByIssueIds": [str(first.pk)]}, format="json")
    assert child.status_code == 201, child.content
    shown = board_client.get(f"/api/issues/{child.json()['id']}").json()
    assert [b["id"] for b in shown["blockedBy"]] == [str(first.pk)]
    assert Issue.objects.get(pk=child.json()["id"]).parent_id == issue.pk
    elsewhere = IssueFactory()  # another company's issue is refused, and nothing is created
    count = Issue.objects.count()
    refused = board_client.post(f"/api/issues/{issue.pk}/children",
                                {"title": "Third part", "blockedByIssueIds": [str(elsewhere.pk)]}, format="json")
    assert refused.status_code == 422 and Issue.objects.count() == count


def test_document_conflicts_use_upstreams_messages(board_client, issue):
    first = put(board_client, issue, "plan", format="markdown", body="v1")
    assert first.status_code == 201
    current = first.json()["latestRevisionId"]
    missing = put(board_client, issue, "plan", format="markdown", body="v2")  # exists, no base sent
    assert missing.status_code == 409 and missing.json()["error"] == "Document update requires baseRevisionId"
    assert missing.json()["details"]["currentRevisionId"] == current
    assert put(board_client, issue, "plan", format="markdown", body="v2", baseRevisionId=current).status_code == 200
    stale = put(board_client, issue, "plan", format="markdown", body="v3", baseRevisionId=current)
    assert stale.status_code == 409 and stale.json()["error"] == "Document was updated by someone else"
    fresh = put(board_client, issue, "notes", format="markdown", body="x", baseRevisionId=current)
    assert fresh.status_code == 409 and fresh.json()["error"] == "Document does not exist yet"
