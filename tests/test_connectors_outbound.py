"""The outbound write engine (§10) against the GitHub-compatible sandbox over real HTTP: effects
recorded with the Paperclip change, drained by the worker task with retries, posted once even when
a delivery is retried after its outcome was lost, echo suppression, status projection with gated
closure, toggles with the §10.2 defaults, debounced milestone comments and the run-failure notice."""

import pytest
from rest_framework.test import APIClient

from connectors.choices import OutboundKind, OutboundStatus
from connectors.models import Conflict, InboundEvent, OutboundEffect, TaskLink
from connectors.services import outbound
from connectors.services.instances import instance_create
from issues.actors import SYSTEM, Actor
from issues.models import Comment, Issue
from issues.services.issues import issue_update
from issues.services.runs import run_finish
from issues.services.thread import comment_create
from tests.connector_helpers import delivery_headers
from tests.factories import AgentFactory, RunFactory
from tests.github_sandbox import (
    DEFAULT_STATE_MAPPING,
    SANDBOX_REPO,
    SANDBOX_TOKEN,
    SANDBOX_WEBHOOK_SECRET,
    SERVICE_LOGIN,
)

SECTION_10_2 = {"postBacklink": True, "postProgressComments": True, "postArtifactLinks": True,
                "mirrorAgentComments": False, "postTranscripts": False, "projectStatus": True,
                "mirrorExternalComments": True}


@pytest.fixture
def coder(company):
    return AgentFactory(company=company, name="coder")


@pytest.fixture
def instance(company, coder, github_sandbox, monkeypatch):
    monkeypatch.setenv("PAPERCLIP_SECRET_GH_OUT_TOKEN", SANDBOX_TOKEN)
    monkeypatch.setenv("PAPERCLIP_SECRET_GH_OUT_HOOK", SANDBOX_WEBHOOK_SECRET)
    return instance_create(
        actor=SYSTEM, company=company, name="sandbox-out", provider_key="github_issues",
        base_url=github_sandbox.base_url, containers=[SANDBOX_REPO], state_mapping=DEFAULT_STATE_MAPPING,
        credentials="env:PAPERCLIP_SECRET_GH_OUT_TOKEN", webhook_secret="env:PAPERCLIP_SECRET_GH_OUT_HOOK", service_account_id=SERVICE_LOGIN,
        triage_agent_id=coder.pk, default_sync_mode="bidirectional",
        routing_rules=[{"kind": "default_route", "agentId": coder.pk}])


def forward(sandbox, instance, capture, start=0):
    out = []
    for delivery in sandbox.deliveries[start:]:
        headers = delivery_headers(delivery)
        with capture(execute=True):
            out.append(APIClient().post(f"/api/connectors/{instance.pk}/webhook", data=delivery.body,
                                        content_type="application/json", **headers))
    return out


@pytest.fixture
def linked(instance, github_sandbox, django_capture_on_commit_callbacks):
    gh = github_sandbox.open_issue("Crash on start", "It crashes.", actor="octocat")
    forward(github_sandbox, instance, django_capture_on_commit_callbacks)
    link = TaskLink.objects.get(instance=instance)
    return gh["number"], link


def update(capture, issue, **changes):
    with capture(execute=True):
        return issue_update(actor=SYSTEM, issue=issue, changes=changes)[0]


def open_title_conflict(sandbox, instance, capture, number, link):
    """The title changed on both sides since the base: returns the one open conflict."""
    update(capture, link.issue, title="Paperclip title")
    start = len(sandbox.deliveries)
    sandbox.edit_issue(number, title="Tracker title", actor="octocat")
    forward(sandbox, instance, capture, start=start)
    conflict = Conflict.objects.get(link=link, status="open")
    assert (conflict.field, conflict.external_value, conflict.paperclip_value) == (
        "title", "Tracker title", "Paperclip title")
    return conflict


def marked(sandbox, number):
    return [c for c in sandbox.comments_of(number) if "<!-- paperclip:effect:" in c["body"]]


def test_write_toggles_default_exactly_as_section_10_2(linked, github_sandbox):
    number, link = linked
    # the backlink was written at import (postBacklink on), through the same engine
    backlink = OutboundEffect.objects.get(link=link, kind=OutboundKind.BACKLINK)
    assert backlink.status == OutboundStatus.DONE
    assert any("paperclip:backlink" in c["body"] and link.issue.identifier in c["body"]
               for c in github_sandbox.comments_of(number))
    assert outbound.write_policy(link) == SECTION_10_2
    TaskLink.objects.filter(pk=link.pk).update(write_policy={"postProgressComments": False})
    link.refresh_from_db()
    assert outbound.write_policy(link) == {**SECTION_10_2, "postProgressComments": False}


def test_status_projection_maps_inverse_and_gates_closure(
        linked, github_sandbox, instance, django_capture_on_commit_callbacks):
    number, link = linked
    capture = django_capture_on_commit_callbacks
    issue = update(capture, link.issue, status="in_progress")
    # in_progress -> the operator-mapped active state ("in progress" label) through the adapter
    assert "in progress" in [lbl["name"] for lbl in github_sandbox.issue(number)["labels"]]
    effect = OutboundEffect.objects.get(link=link, kind=OutboundKind.STATE)
    assert effect.status == OutboundStatus.DONE and effect.payload["stateName"] == "in progress"
    # the tracker's echo of our own write is dropped and never becomes a conflict
    seen = len(github_sandbox.deliveries)
    assert seen > 1
    forward(github_sandbox, instance, capture, start=1)
    assert not Conflict.objects.exists()
    assert InboundEvent.objects.filter(outcome__contains="echo").exists()
    # done with fieldPolicy.state=shared (default): a completion comment, the task stays open
    issue = update(capture, issue, status="done")
    assert github_sandbox.issue(number)["state"] == "open"
    done = marked(github_sandbox, number)
    assert len(done) == 1 and "Closing the task is left to you" in done[0]["body"]
    assert "coder via Paperclip" in done[0]["body"] and issue.identifier in done[0]["body"]
    # fieldPolicy.state=paperclip permits Paperclip-side closure
    TaskLink.objects.filter(pk=link.pk).update(field_policy={**link.field_policy, "state": "paperclip"})
    issue = update(capture, issue, status="todo")
    update(capture, issue, status="done")
    assert github_sandbox.issue(number)["state"] == "closed"


def test_in_review_without_a_review_state_is_a_review_requested_comment(
        linked, github_sandbox, instance, django_capture_on_commit_callbacks):
    number, link = linked
    instance.state_mapping = {"open": "backlog", "closed": "terminal"}
    instance.save(update_fields=["state_mapping"])
    update(django_capture_on_commit_callbacks, link.issue, status="in_review")
    bodies = [c["body"] for c in marked(github_sandbox, number)]
    assert len(bodies) == 1 and "Review requested" in bodies[0]
    assert not OutboundEffect.objects.filter(link=link, kind=OutboundKind.STATE).exists()


def test_import_only_links_write_nothing(linked, github_sandbox, django_capture_on_commit_callbacks):
    number, link = linked
    TaskLink.objects.filter(pk=link.pk).update(sync_mode="import_only")
    before = set(OutboundEffect.objects.values_list("pk", flat=True))
    update(django_capture_on_commit_callbacks, link.issue, status="in_progress")
    update(django_capture_on_commit_callbacks, TaskLink.objects.get(pk=link.pk).issue, status="done")
    assert set(OutboundEffect.objects.values_list("pk", flat=True)) == before
    assert github_sandbox.issue(number)["state"] == "open" and github_sandbox.issue(number)["labels"] == []


def test_a_comment_is_posted_once_even_when_the_job_retries(
        linked, github_sandbox, django_capture_on_commit_callbacks, settings):
    number, link = linked
    settings.CONNECTORS = {**settings.CONNECTORS, "RETRY_BASE_SECONDS": 0.0}
    github_sandbox.fail_next(1, "error", status=502)
    update(django_capture_on_commit_callbacks, link.issue, status="done")  # completion comment
    effect = OutboundEffect.objects.get(link=link, kind=OutboundKind.COMMENT, source_id__startswith="done:")
    # first attempt failed at the provider (a health entry), the retry wrote it
    assert (effect.status, effect.attempts) == (OutboundStatus.DONE, 2)
    from connectors.models import SyncError

    assert SyncError.objects.filter(link=link, message__contains="Outbound comment").count() == 1
    assert effect.status == OutboundStatus.DONE and len(marked(github_sandbox, number)) == 1
    # the worker died after the provider accepted the write but before the outcome was saved:
    # the retried job finds its marker and does not post again
    OutboundEffect.objects.filter(pk=effect.pk).update(status=OutboundStatus.PENDING, next_attempt_at=None)
    assert outbound.effect_deliver(effect_id=effect.pk) == "done"
    assert outbound.effect_deliver(effect_id=effect.pk) == "not_pending"
    assert len(marked(github_sandbox, number)) == 1
    effect.refresh_from_db()
    assert effect.external_ref == str(marked(github_sandbox, number)[0]["id"])


def test_echo_of_our_comment_is_dropped_by_author_key_and_marker(
        linked, github_sandbox, instance, django_capture_on_commit_callbacks):
    number, link = linked
    capture = django_capture_on_commit_callbacks
    start = len(github_sandbox.deliveries)
    update(capture, link.issue, status="done")
    posted = marked(github_sandbox, number)[0]
    forward(github_sandbox, instance, capture, start=start)  # the bot's own comment comes back
    assert not Comment.objects.filter(provenance__externalCommentId=str(posted["id"])).exists()
    # a provider that obscures authorship: same comment id, another sender -> the outbound key drops it
    from connectors.services.inbound import event_store, task_events_process
    from connectors.providers.base import EventKind, ExternalActor, ExternalComment, VerifiedEvent

    other = ExternalActor(provider_key="github_issues", external_user_id="999", display_name="relay")
    for cid, body in ((str(posted["id"]), "edited copy"), ("555001", "copied <!-- paperclip:effect:1 -->")):
        event_store(instance=instance, event=VerifiedEvent(
            event_id=f"obscured-{cid}", kind=EventKind.COMMENT_UPSERTED, action="created",
            external_task_id=link.external_task_id, actor=other,
            comment=ExternalComment(external_comment_id=cid, external_task_id=link.external_task_id,
                                    author=other, body=body)))
    task_events_process(instance_id=instance.pk, external_task_id=link.external_task_id)
    outcomes = list(InboundEvent.objects.filter(idempotency_key__startswith="obscured-").order_by("id")
                    .values_list("status", "outcome"))
    assert outcomes == [("dropped", "matches a recently issued outbound write (echo)"),
                        ("dropped", "mirrored comment marker (loop prevention)")]


def test_an_agents_comments_stay_in_paperclip_unless_the_thread_is_mirrored(
        linked, github_sandbox, coder, django_capture_on_commit_callbacks):
    """§10.2: progress comments are milestones (claimed, plan ready, PR opened, review requested,
    done), not per-heartbeat chatter: an agent's comments reach the tracker only when the link
    mirrors the whole thread (mirrorAgentComments, off by default)."""
    number, link = linked
    run = RunFactory(agent=coder, issue=link.issue)
    actor = Actor(agent=coder, run_header=str(run.pk))
    with django_capture_on_commit_callbacks(execute=True):
        comment_create(actor=actor, issue=link.issue, body="Looking at the config loader.")
        comment_create(actor=actor, issue=link.issue, body="Tests green")
    assert marked(github_sandbox, number) == []
    assert not OutboundEffect.objects.filter(link=link, kind=OutboundKind.COMMENT).exists()

    TaskLink.objects.filter(pk=link.pk).update(write_policy={"mirrorAgentComments": True})
    with django_capture_on_commit_callbacks(execute=True):
        comment = comment_create(actor=actor, issue=link.issue, body="Root cause found.\n\nThe loader reads…")
    [body] = [c["body"] for c in marked(github_sandbox, number)]
    assert "Root cause found.\n\nThe loader reads…" in body and "coder via Paperclip" in body
    assert OutboundEffect.objects.filter(link=link, source_id=f"comment:{comment.pk}").count() == 1


def test_a_full_batch_starts_the_next_comment_and_no_line_is_dropped(
        linked, github_sandbox, coder, django_capture_on_commit_callbacks):
    """§10.2: debounced milestones are held, never lost: a pending comment carries at most
    MAX_BATCHED_LINES lines, and the next line waits in the next comment, a window later."""
    from connectors.services.outbound import MAX_BATCHED_LINES
    from issues.services.work_products import work_product_create

    number, link = linked
    run = RunFactory(agent=coder, issue=link.issue)
    actor = Actor(agent=coder, run_header=str(run.pk))
    sent = [f"build {n}" for n in range(MAX_BATCHED_LINES + 3)]
    with django_capture_on_commit_callbacks(execute=True):  # posted at once: opens the window
        work_product_create(actor=actor, issue=link.issue, kind="branch", external_id="fix/config-loader")
    assert len(marked(github_sandbox, number)) == 1
    with django_capture_on_commit_callbacks(execute=True):
        for title in sent:
            work_product_create(actor=actor, issue=link.issue, kind="artifact", title=title,
                                url=f"https://ci.example.test/{title.replace(' ', '/')}")
    batches = list(OutboundEffect.objects.filter(link=link, status=OutboundStatus.PENDING,
                                                 payload__milestone="artifact").order_by("id"))
    assert [line for b in batches for line in b.payload["lines"]] == [
        f"Artifact: [{title}](https://ci.example.test/{title.replace(' ', '/')})" for title in sent]
    assert [len(b.payload["lines"]) for b in batches] == [MAX_BATCHED_LINES, 3]
    assert batches[1].next_attempt_at > batches[0].next_attempt_at  # one comment per window


def test_a_failed_run_is_reported_on_the_tracker(linked, github_sandbox, coder, django_capture_on_commit_callbacks):
    number, link = linked
    run = RunFactory(agent=coder, issue=link.issue, status="running")
    with django_capture_on_commit_callbacks(execute=True):
        run_finish(run=run, status="failed", error="adapter exited with 2\ntraceback…")
    bodies = [c["body"] for c in marked(github_sandbox, number)]
    assert len(bodies) == 1
    # What happens next follows the host's retry rule: a failed run is not retried...
    assert "run failed: adapter exited with 2" in bodies[0] and "No automatic retry" in bodies[0]
    assert "traceback" not in bodies[0]
    # ...a lost process (interrupted) is, within the agent's retry budget.
    lost = RunFactory(agent=coder, issue=link.issue, status="running")
    with django_capture_on_commit_callbacks(execute=True):
        run_finish(run=lost, status="interrupted", error="worker lost")
    bodies = [c["body"] for c in marked(github_sandbox, number)]
    assert len(bodies) == 2 and "retries automatically (attempt 1 of 3)" in bodies[1]


def test_effects_are_unique_per_link_kind_and_source(linked):
    _, link = linked
    a = outbound.effect_record(link=link, kind=OutboundKind.COMMENT, source_id="x:1", payload={"lines": ["a"]})
    b = outbound.effect_record(link=link, kind=OutboundKind.COMMENT, source_id="x:1", payload={"lines": ["b"]})
    assert a.pk == b.pk and OutboundEffect.objects.filter(source_id="x:1").count() == 1


def test_the_link_outbox_is_listed_for_board_users(linked, company, django_capture_on_commit_callbacks):
    from tests.factories import MembershipFactory

    _, link = linked
    update(django_capture_on_commit_callbacks, link.issue, status="done")
    c = APIClient()
    c.force_login(MembershipFactory(company=company, role="viewer").user)
    rows = c.get(f"/api/connector-links/{link.pk}/outbound").json()
    kinds = {(r["kind"], r["status"]) for r in rows}
    assert ("backlink", "done") in kinds and ("comment", "done") in kinds
    assert all(r["linkId"] == str(link.pk) for r in rows)


def claimed_by(agent, link, capture):
    """The linked issue, made todo and checked out by ``agent`` under a running run: (issue, run)."""
    from issues.services.checkout import issue_checkout

    issue = update(capture, link.issue, status="todo")
    run = RunFactory(agent=agent, issue=None)
    with capture(execute=True):
        issue_checkout(actor=Actor(agent=agent, run_header=str(run.pk)), agent_id=agent.pk,
                       expected_statuses=["todo"], issue=issue)
    return issue, run


def test_checkout_is_projected_as_a_claim_comment_and_the_active_state(
        linked, github_sandbox, coder, django_capture_on_commit_callbacks):
    from issues.services.checkout import issue_checkout

    number, link = linked
    issue, run = claimed_by(coder, link, django_capture_on_commit_callbacks)
    bodies = [c["body"] for c in marked(github_sandbox, number)]
    assert len(bodies) == 1 and "coder picked this up" in bodies[0] and "coder via Paperclip" in bodies[0]
    assert "in progress" in [lbl["name"] for lbl in github_sandbox.issue(number)["labels"]]
    # the release is projected too (§10.3 claim/run/retry/release): the claim ended, the task waits
    from issues.services.checkout import issue_release

    with django_capture_on_commit_callbacks(execute=True):
        issue_release(actor=Actor(agent=coder, run_header=str(run.pk)), issue=issue)
    bodies = [c["body"] for c in marked(github_sandbox, number)]
    assert len(bodies) == 2 and "coder released this task" in bodies[1]
    # the same run claims it again: a new claim, projected again (not deduped as the first one)
    with django_capture_on_commit_callbacks(execute=True):
        issue_checkout(actor=Actor(agent=coder, run_header=str(run.pk)), agent_id=coder.pk,
                       expected_statuses=["todo"], issue=Issue.objects.get(pk=issue.pk))
    bodies = [c["body"] for c in marked(github_sandbox, number)]
    assert len(bodies) == 3 and "coder picked this up" in bodies[2]


def test_a_board_reassignment_names_the_agent_whose_claim_ended_not_the_new_one(
        linked, github_sandbox, coder, company, django_capture_on_commit_callbacks):
    """§10.4: the message is attributed to who acted; reassigning an in_progress issue ends the old
    agent's claim (the issue goes back to todo), and the new assignee released nothing."""
    from tests.factories import MembershipFactory

    number, link = linked
    issue, _ = claimed_by(coder, link, django_capture_on_commit_callbacks)
    newcomer = AgentFactory(company=company, name="newcomer")
    board = Actor(user=MembershipFactory(company=company, role="owner").user)
    with django_capture_on_commit_callbacks(execute=True):
        issue_update(actor=board, issue=Issue.objects.get(pk=issue.pk), changes={"assignee_agent_id": newcomer.pk})
    assert Issue.objects.get(pk=issue.pk).status == "todo"
    last = marked(github_sandbox, number)[-1]["body"]
    assert "coder no longer works on this task" in last and "newcomer" not in last


def test_a_board_release_names_the_agent_whose_claim_ended(
        linked, github_sandbox, coder, company, django_capture_on_commit_callbacks):
    """§10.4: a board user releasing an agent's claim is not "the agent": the note names the agent
    that held it (the release clears the assignee, so the release's change carries who it was)."""
    from issues.services.checkout import issue_release
    from tests.factories import MembershipFactory

    number, link = linked
    issue, _ = claimed_by(coder, link, django_capture_on_commit_callbacks)
    board = Actor(user=MembershipFactory(company=company, role="owner").user)
    with django_capture_on_commit_callbacks(execute=True):
        issue_release(actor=board, issue=Issue.objects.get(pk=issue.pk))
    last = marked(github_sandbox, number)[-1]["body"]
    assert "coder no longer works on this task" in last, last


def test_conflict_round_trip_keep_paperclip_writes_the_tracker_once_and_is_not_redetected(
        linked, github_sandbox, instance, company, django_capture_on_commit_callbacks):
    from connectors.services.conflicts import conflict_resolve
    from tests.factories import MembershipFactory

    number, link = linked
    capture = django_capture_on_commit_callbacks
    conflict = open_title_conflict(github_sandbox, instance, capture, number, link)
    operator = MembershipFactory(company=company, role="operator").user
    start = len(github_sandbox.deliveries)
    with capture(execute=True):
        conflict_resolve(actor=Actor(user=operator), conflict=conflict, action="keep_paperclip",
                         idempotency_key="rt-1")
    assert github_sandbox.issue(number)["title"] == "Paperclip title"  # pushed outbound, once
    effect = OutboundEffect.objects.get(link=link, source_id=f"conflict:{conflict.pk}")
    assert (effect.status, effect.attempts) == (OutboundStatus.DONE, 1)
    forward(github_sandbox, instance, capture, start=start)  # the bot's edit comes back: echo
    link.refresh_from_db()
    assert not Conflict.objects.filter(status="open").exists() and link.status == "healthy"
    assert link.issue.title == "Paperclip title"


def test_closure_conflict_keep_paperclip_reopens_the_tracker_task(
        linked, github_sandbox, instance, company, django_capture_on_commit_callbacks):
    from connectors.services.conflicts import conflict_resolve
    from tests.factories import MembershipFactory

    number, link = linked
    capture = django_capture_on_commit_callbacks
    update(capture, link.issue, status="in_review")
    start = len(github_sandbox.deliveries)
    github_sandbox.close_issue(number, actor="octocat")
    forward(github_sandbox, instance, capture, start=start)
    conflict = Conflict.objects.get(link=link, kind="closure", status="open")
    operator = MembershipFactory(company=company, role="operator").user
    with capture(execute=True):
        conflict_resolve(actor=Actor(user=operator), conflict=conflict, action="keep_paperclip")
    gh = github_sandbox.issue(number)
    assert gh["state"] == "open" and "in review" in [lbl["name"] for lbl in gh["labels"]]
    link.refresh_from_db()
    assert link.issue.status == "in_review" and link.status == "healthy"
