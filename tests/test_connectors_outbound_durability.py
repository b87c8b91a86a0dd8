"""Outbound writes that survive outages (§13.1.1, §13.1.2, §12.2, §13.3) against the GitHub, Linear
and Jira sandboxes over real HTTP: an outage far longer than the old five-attempt budget delivers
every pending write exactly once and in order per link; a write that retried over the whole horizon
is parked with a health entry and replayed by an operator (API, console, command; audited,
idempotent); a permanent refusal fails at once; a rate limit holds the instance's writes until the
reset; health shows pending writes with their next due time; a credential failure is one visible
health error, one activity entry and a dashboard alert, never a link in error, and ends with a
successful write, poll or credential rotation.

Time moves with time-machine; the worker's part of the sweep is ``sweep()`` below."""
from __future__ import annotations

import re
from datetime import timedelta

import pytest
import time_machine
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from rest_framework.test import APIClient

from connectors import tasks
from connectors.choices import LinkStatus, OutboundKind, OutboundStatus
from connectors.models import ConnectorInstance, Intervention, OutboundEffect, SyncError, TaskLink
from connectors.sandbox.github import GitHubSandbox
from connectors.selectors import instance_health
from connectors.services import outbound
from connectors.services.instances import instance_create
from connectors.services.polling import instance_poll
from issues.actors import SYSTEM
from issues.models import ActivityLog, Issue
from issues.services.issues import issue_update
from tests.factories import AgentFactory, MembershipFactory
from tests.github_sandbox import DEFAULT_STATE_MAPPING, SANDBOX_REPO, SANDBOX_TOKEN, SANDBOX_WEBHOOK_SECRET, SERVICE_LOGIN
from tests.test_connectors_outbound import forward
from tests.test_connectors_round_trips import Tracker, build_instance, make_sandbox

EFFECT_MARKER = re.compile(r"paperclip:effect:(\d+)")
OLD_BUDGET = 5  # attempts after which the engine used to give up (CONNECTORS["MAX_ATTEMPTS"])


class Side:
    """One provider's sandbox, the connector instance on it and the webhook hop, with what a tracker
    user sees: the effect markers of the comments (in order) and the task's state."""

    def __init__(self, key, sandbox, instance, capture):
        self.key, self.sandbox, self.instance, self.capture = key, sandbox, instance, capture
        self.tracker = None if key == "github" else Tracker(key, sandbox, instance, capture)
        self._forwarded = 0

    def open(self, title: str) -> TaskLink:
        before = set(TaskLink.objects.filter(instance=self.instance).values_list("pk", flat=True))
        if self.key == "github":
            self.sandbox.open_issue(title, "It crashes.", actor="octocat")
            start, self._forwarded = self._forwarded, len(self.sandbox.deliveries)
            forward(self.sandbox, self.instance, self.capture, start=start)
        else:
            self.tracker.open(title)
            self.tracker.forward()
        return TaskLink.objects.filter(instance=self.instance).exclude(pk__in=before).get()

    def markers(self, link) -> list[str]:
        """Effect ids of the marked comments on the task, in the order the tracker holds them."""
        if self.key == "github":
            number = int(link.external_key.rsplit("#", 1)[1])
            return [m for c in self.sandbox.comments_of(number) for m in EFFECT_MARKER.findall(c["body"])]
        return [m for c in self.tracker.comments(link.external_task_id) for m in c["markers"]]

    def state(self, link) -> str:
        if self.key == "github":
            number = int(link.external_key.rsplit("#", 1)[1])
            labels = {lbl["name"] for lbl in self.sandbox.issue(number)["labels"]}
            return "In Review" if "in review" in labels else "In Progress" if "in progress" in labels else "open"
        return self.tracker.task(link.external_task_id)["state"]


def github_instance(sandbox, company, agent, monkeypatch):
    monkeypatch.setenv("PAPERCLIP_SECRET_GH_DURABLE_TOKEN", SANDBOX_TOKEN)
    monkeypatch.setenv("PAPERCLIP_SECRET_GH_DURABLE_HOOK", SANDBOX_WEBHOOK_SECRET)
    return instance_create(
        actor=SYSTEM, company=company, name="github-durable", provider_key="github_issues",
        base_url=sandbox.base_url, containers=[SANDBOX_REPO], state_mapping=DEFAULT_STATE_MAPPING,
        credentials="env:PAPERCLIP_SECRET_GH_DURABLE_TOKEN", webhook_secret="env:PAPERCLIP_SECRET_GH_DURABLE_HOOK",
        service_account_id=SERVICE_LOGIN, triage_agent_id=agent.pk, default_sync_mode="bidirectional",
        routing_rules=[{"kind": "default_route", "agentId": agent.pk}])


@pytest.fixture
def coder(company):
    return AgentFactory(company=company, name="coder")


@pytest.fixture
def clock():
    with time_machine.travel(timezone.now(), tick=False) as traveller:
        yield traveller


def open_side(key, company, coder, monkeypatch, capture):
    if key == "github":
        sandbox = GitHubSandbox(repos=(SANDBOX_REPO,), token=SANDBOX_TOKEN, service_login=SERVICE_LOGIN,
                                webhook_secret=SANDBOX_WEBHOOK_SECRET)
        sandbox.start()
        return Side(key, sandbox, github_instance(sandbox, company, coder, monkeypatch), capture)
    sandbox = make_sandbox(key).start()
    return Side(key, sandbox, build_instance(key, sandbox, company, coder, monkeypatch), capture)


@pytest.fixture(params=("github", "linear", "jira"))
def side(request, company, coder, monkeypatch, django_capture_on_commit_callbacks, clock):
    tracker = open_side(request.param, company, coder, monkeypatch, django_capture_on_commit_callbacks)
    yield tracker
    tracker.sandbox.stop()


@pytest.fixture
def github(company, coder, monkeypatch, django_capture_on_commit_callbacks, clock):
    tracker = open_side("github", company, coder, monkeypatch, django_capture_on_commit_callbacks)
    yield tracker
    tracker.sandbox.stop()


def update(side, link, **changes):
    issue = TaskLink.objects.get(pk=link.pk).issue
    with side.capture(execute=True):
        return issue_update(actor=SYSTEM, issue=issue, changes=changes)[0]


def sweep(side):
    """The outbound part of the periodic sweep (connectors.tasks.sweep), as the worker runs it."""
    with side.capture(execute=True):
        for effect_id in outbound.effects_due():
            tasks.deliver_outbound(effect_id)


def next_retry_at(instance):
    """When the worker next has something to retry (the earliest scheduled attempt still ahead)."""
    return (OutboundEffect.objects.filter(instance=instance, status=OutboundStatus.PENDING,
                                          next_attempt_at__gt=timezone.now())
            .order_by("next_attempt_at").values_list("next_attempt_at", flat=True).first())


def ride(side, clock, *, until, stop=lambda: False) -> int:
    """Let the worker sweep on schedule until ``until`` (or ``stop()``); returns the sweeps made."""
    sweeps = 0
    while True:
        sweep(side)
        sweeps += 1
        due = next_retry_at(side.instance)
        if stop() or due is None or due > until:
            return sweeps
        clock.move_to(due + timedelta(seconds=1))


def effects(link):
    return list(OutboundEffect.objects.filter(link=link).exclude(kind=OutboundKind.BACKLINK).order_by("id"))


def board(company, role="owner"):
    client = APIClient()
    client.force_login(MembershipFactory(company=company, role=role).user)
    return client


# --- outage, order, exactly once ------------------------------------------------------------------
def test_a_three_hour_outage_delivers_every_pending_write_once_in_order_per_link(side, clock):
    link = side.open("Crash on start")
    side.sandbox.outage(503)
    update(side, link, status="in_progress")  # state write (active)
    update(side, link, status="in_review")  # state write (review) and the review comment
    update(side, link, status="done")  # the completion comment
    writes = effects(link)
    assert [e.kind for e in writes] == ["state", "state", "comment", "comment"]
    head, *queued = writes
    # the first write failed at the provider; the later ones of the link wait for it, unattempted
    assert (head.status, head.attempts, head.error_category) == ("pending", 1, "provider_status")
    assert [e.attempts for e in queued] == [0, 0, 0]

    start = timezone.now()
    ride(side, clock, until=start + timedelta(hours=3))
    head.refresh_from_db()
    assert head.status == OutboundStatus.PENDING and head.attempts > 2 * OLD_BUDGET  # never given up
    assert [e.attempts for e in effects(link)[1:]] == [0, 0, 0]
    # health (§12.2): pending writes with the oldest and the next due time; degraded, links untouched
    health = board(side.instance.company).get(f"/api/connectors/{side.instance.pk}/health").json()
    out = health["outbound"]
    assert (out["pendingCount"], out["retryingCount"], out["parkedCount"], out["failedCount"]) == (4, 1, 0, 0)
    head.refresh_from_db()
    assert abs(parse_datetime(out["nextAttemptAt"]) - head.next_attempt_at) < timedelta(seconds=1)
    assert head.next_attempt_at > timezone.now()  # the next due time is ahead: a scheduled retry
    assert out["oldestPendingAgeSeconds"] >= 2 * 3600 and [r["effectId"] for r in out["retries"]] == [head.pk]
    assert health["status"] == "degraded" and "retrying" in health["statusReason"]
    assert TaskLink.objects.get(pk=link.pk).status == LinkStatus.HEALTHY
    # one health entry for the outage, not one per attempt
    assert SyncError.objects.filter(link=link, message__contains=f"Outbound state {head.source_id}").count() == 1

    side.sandbox.recover()
    ride(side, clock, until=timezone.now() + timedelta(hours=1))
    delivered = effects(link)
    assert [e.status for e in delivered] == ["done"] * 4
    assert [e.attempts for e in delivered[1:]] == [1, 1, 1]
    # in order: the activity log's writes follow the effect order; the tracker ends in review state
    # (in progress first, then review) and holds each comment exactly once, review before done
    written = list(ActivityLog.objects.filter(action="connector.outbound_written", entity_id=str(link.pk))
                   .order_by("id").values_list("details__effectId", flat=True))
    assert written[-4:] == [e.pk for e in delivered] and len(written) == len(set(written))
    assert side.state(link) == "In Review"
    assert side.markers(link) == [str(delivered[2].pk), str(delivered[3].pk)]
    assert instance_health(side.instance)["outbound"]["pendingCount"] == 0


def test_a_comment_held_by_the_milestone_window_does_not_hold_the_links_later_writes(github, clock):
    from issues.actors import Actor
    from issues.services.work_products import work_product_create
    from tests.factories import RunFactory

    link = github.open("Crash on start")
    agent = AgentFactory(company=link.company, name="writer")
    Issue.objects.filter(pk=link.issue_id).update(assignee_agent=agent)  # its own issue: it records work
    run = RunFactory(agent=agent, issue=link.issue)
    for kind, name in (("branch", "fix/loader"), ("artifact", "build log")):  # the second link waits 5 minutes
        with github.capture(execute=True):                                  # (§10.2 milestone debounce)
            work_product_create(actor=Actor(agent=agent, run_header=str(run.pk)), issue=link.issue, kind=kind,
                                external_id=name, title=name)
    update(github, link, status="in_progress")
    first, held, state = effects(link)
    assert (first.status, held.status, held.attempts, state.status) == ("done", "pending", 0, "done")
    assert github.state(link) == "In Progress"  # the state write did not wait for the held comment
    ride(github, clock, until=timezone.now() + timedelta(minutes=10))
    assert OutboundEffect.objects.get(pk=held.pk).status == "done"
    assert github.markers(link) == [str(first.pk), str(held.pk)]


# --- parking and replay ---------------------------------------------------------------------------
def test_after_the_horizon_a_write_is_parked_later_writes_go_on_and_an_operator_replays_it_once(
        github, clock, settings):
    settings.CONNECTORS = {**settings.CONNECTORS, "OUTBOUND_RETRY_HORIZON_SECONDS": 3600.0,
                           "OUTBOUND_RETRY_MAX_SECONDS": 600.0}
    link = github.open("Crash on start")
    github.sandbox.outage(503)
    update(github, link, status="done")  # the completion comment
    update(github, link, status="in_progress")  # then a state write, queued behind it
    comment, state = effects(link)
    ride(github, clock, until=timezone.now() + timedelta(hours=3),
         stop=lambda: OutboundEffect.objects.get(pk=comment.pk).status != "pending")
    comment.refresh_from_db()
    assert comment.status == OutboundStatus.PARKED and comment.parked_at is not None
    assert comment.error_category == "provider_status" and comment.attempts > OLD_BUDGET
    parked_entry = SyncError.objects.get(instance=github.instance, category="outbound_parked")
    assert parked_entry.details["effectId"] == comment.pk and "1 h retry horizon" in parked_entry.message
    # a parked write does not hold its link: the state write went to the provider next (still down)
    assert OutboundEffect.objects.get(pk=state.pk).attempts == 1
    health = instance_health(github.instance)
    assert health["status"] == "degraded" and health["outbound"]["parkedCount"] == 1
    assert [r["effectId"] for r in health["outbound"]["replayable"]] == [comment.pk]

    github.sandbox.recover()
    ride(github, clock, until=timezone.now() + timedelta(hours=1))
    assert OutboundEffect.objects.get(pk=state.pk).status == "done" and github.markers(link) == []

    client = board(github.instance.company)
    url = f"/api/connector-outbound/{comment.pk}/replay"
    with github.capture(execute=True):
        first = client.post(url, {"idempotencyKey": "replay-1", "reason": "provider back"}, format="json")
    assert first.status_code == 200, first.content
    assert first.json()["outcome"] == "queued" and first.json()["replayed"] is False
    assert OutboundEffect.objects.get(pk=comment.pk).status == "done"
    assert github.markers(link) == [str(comment.pk)]
    again = client.post(url, {"idempotencyKey": "replay-1"}, format="json")  # a retried request: same answer
    assert again.status_code == 200 and again.json()["replayed"] is True
    assert Intervention.objects.filter(action="outbound.replay").count() == 1
    assert ActivityLog.objects.filter(action="connector.outbound.replay", entity_id=str(comment.pk)).count() == 1
    done = client.post(url, {"idempotencyKey": "replay-2"}, format="json")
    assert done.status_code == 422 and done.json()["code"] == "outbound_not_replayable"
    # the outcome of a write that reached the provider was lost and it parked: the replay finds its
    # marker on the tracker and posts nothing
    OutboundEffect.objects.filter(pk=comment.pk).update(status=OutboundStatus.PARKED)
    with github.capture(execute=True):
        assert client.post(url, {"idempotencyKey": "replay-3"}, format="json").status_code == 200
    assert OutboundEffect.objects.get(pk=comment.pk).status == "done" and github.markers(link) == [str(comment.pk)]


def test_replay_all_from_the_console_and_the_command_skips_superseded_state_writes(github, clock, settings):
    settings.CONNECTORS = {**settings.CONNECTORS, "OUTBOUND_RETRY_HORIZON_SECONDS": 0.0}  # park at once
    link = github.open("Crash on start")
    github.sandbox.outage(503)
    update(github, link, status="in_progress")  # parks
    update(github, link, status="done")  # the completion comment parks too
    first_state, comment = effects(link)
    assert [e.status for e in effects(link)] == ["parked", "parked"]
    github.sandbox.recover()
    update(github, link, status="in_review")  # a later state write goes through at once
    assert github.state(link) == "In Review"

    operator = Client()
    operator.force_login(MembershipFactory(company=link.company, role="operator").user)
    page = operator.get(reverse("connectors_console:instance-detail", args=[github.instance.pk])).content.decode()
    assert 'id="outbound"' in page and f'id="outbound-{comment.pk}"' in page and 'id="outbound-replay-all"' in page
    assert reverse("connectors_console:outbound-replay", args=[comment.pk]) in page
    with github.capture(execute=True):
        response = operator.post(reverse("connectors_console:outbound-replay-all", args=[github.instance.pk]),
                                 {"idempotency_key": "console-all-1"})
    assert response.status_code == 302
    # the old state write would move the tracker back: superseded, not replayed; the comment went out
    first_state.refresh_from_db()
    assert first_state.status == "cancelled" and "superseded" in first_state.error_message
    assert OutboundEffect.objects.get(pk=comment.pk).status == "done" and github.state(link) == "In Review"
    assert github.markers(link)[-1] == str(comment.pk)
    [row] = Intervention.objects.filter(action="outbound.replay")
    assert row.result["effectIds"] == [comment.pk] and row.result["supersededEffectIds"] == [first_state.pk]
    viewer = Client()
    viewer.force_login(MembershipFactory(company=link.company, role="viewer").user)
    assert 'id="outbound-replay-all"' not in viewer.get(
        reverse("connectors_console:instance-detail", args=[github.instance.pk])).content.decode()

    # the command: one effect by id, then --instance --all (nothing left)
    github.sandbox.outage(503)
    update(github, link, status="blocked")  # a state write (the "blocked" label), parked
    [last] = OutboundEffect.objects.filter(link=link, status="parked")
    github.sandbox.recover()
    with github.capture(execute=True):
        call_command("connector_replay_outbound", str(last.pk), "--idempotency-key", "cli-1")
    assert OutboundEffect.objects.get(pk=last.pk).status == "done"
    with github.capture(execute=True):
        call_command("connector_replay_outbound", "--instance", str(github.instance.pk), "--all",
                     "--idempotency-key", "cli-2")
    assert Intervention.objects.get(idempotency_key="cli-2").result["replayedCount"] == 0


# --- permanent refusal, rate limits ---------------------------------------------------------------
def test_a_permanent_refusal_fails_at_once_and_a_rate_limit_holds_the_instance_until_the_reset(github, clock):
    link = github.open("Crash on start")
    other = github.open("Second task")
    github.sandbox.fail_next(1, "error", status=422)  # the provider refuses this request as invalid
    update(github, link, status="done")
    [refused] = effects(link)
    assert (refused.status, refused.attempts, refused.next_attempt_at) == ("failed", 1, None)
    assert SyncError.objects.filter(link=link, message__contains="refused by the provider, not retried").exists()
    assert instance_health(github.instance)["outbound"]["failedCount"] == 1

    github.sandbox.force_429(1, retry_after=900)
    update(github, other, status="done")
    [limited] = effects(other)
    assert limited.status == "pending" and limited.error_category == "provider_rate_limited"
    assert limited.next_attempt_at >= timezone.now() + timedelta(seconds=900)
    until = ConnectorInstance.objects.get(pk=github.instance.pk).provider_degraded_until
    assert until >= timezone.now() + timedelta(seconds=899)
    update(github, link, status="in_progress")  # another link's write waits for the reset, no attempt spent
    deferred = effects(link)[-1]
    assert (deferred.status, deferred.attempts, deferred.next_attempt_at) == ("pending", 0, until)
    assert instance_health(github.instance)["status"] == "degraded"
    clock.move_to(until + timedelta(seconds=1))
    sweep(github)
    assert OutboundEffect.objects.get(pk=limited.pk).status == "done"
    assert OutboundEffect.objects.get(pk=deferred.pk).status == "done"
    assert OutboundEffect.objects.get(pk=deferred.pk).attempts == 1


# --- credentials (§13.1.2) ------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["github", "linear"])
def test_a_credential_failure_is_one_health_error_and_dashboard_alert_until_rotation(
        key, company, coder, monkeypatch, django_capture_on_commit_callbacks, clock):
    side = open_side(key, company, coder, monkeypatch, django_capture_on_commit_callbacks)
    try:
        first, second = side.open("First task"), side.open("Second task")
        side.sandbox.outage(401)  # the token was revoked at the provider
        update(side, first, status="done")
        update(side, second, status="done")
        instance = ConnectorInstance.objects.get(pk=side.instance.pk)
        assert instance.auth_error_at is not None and instance.auth_error_detail
        assert ActivityLog.objects.filter(action="connector.credentials_failed").count() == 1  # per incident
        health = instance_health(instance)
        assert health["status"] == "error" and health["statusReason"].startswith("credentials failed")
        assert health["authError"]["detail"] == instance.auth_error_detail
        # links untouched; the writes are retrying, not failed
        assert set(TaskLink.objects.filter(instance=instance).values_list("status", flat=True)) == {"healthy"}
        assert {e.status for e in effects(first) + effects(second)} == {"pending"}
        owner = board(company)
        alerts = owner.get(f"/api/companies/{company.pk}/dashboard").json()["alerts"]
        assert [(a["kind"], a["entityId"], a["severity"]) for a in alerts] == [
            ("connector.credentials_failed", str(instance.pk), "error")]
        console = Client()
        console.force_login(MembershipFactory(company=company, role="viewer").user)
        dashboard = console.get(reverse("console:dashboard")).content.decode()
        assert 'id="alerts"' in dashboard and f"{instance.name}: connector credentials failed" in dashboard
        detail = console.get(reverse("connectors_console:instance-detail", args=[instance.pk])).content.decode()
        assert "health-error" in detail and "credentials failed" in detail

        side.sandbox.recover()  # the operator issued a new token
        monkeypatch.setenv("PAPERCLIP_SECRET_ROTATED", monkeypatch_value(side))
        with side.capture(execute=True):
            rotated = owner.post(f"/api/connectors/{instance.pk}/credentials",
                                 {"idempotencyKey": "rotate-1", "credentials": "env:PAPERCLIP_SECRET_ROTATED"},
                                 format="json")
        assert rotated.status_code == 200, rotated.content
        instance.refresh_from_db()
        assert instance.auth_error_at is None and instance_health(instance)["status"] != "error"
        assert ActivityLog.objects.filter(action="connector.credentials_restored").count() == 1
        # the rotation kicked the pending writes: delivered now, not at their backoff
        assert {e.status for e in effects(first) + effects(second)} == {"done"}
        assert owner.get(f"/api/companies/{company.pk}/dashboard").json()["alerts"] == []

        # a new incident ends with the next successful write
        side.sandbox.outage(401)
        update(side, first, status="in_progress")
        assert ConnectorInstance.objects.get(pk=instance.pk).auth_error_at is not None
        assert ActivityLog.objects.filter(action="connector.credentials_failed").count() == 2
        side.sandbox.recover()
        ride(side, clock, until=timezone.now() + timedelta(hours=1))
        assert ConnectorInstance.objects.get(pk=instance.pk).auth_error_at is None
    finally:
        side.sandbox.stop()


def monkeypatch_value(side) -> str:
    """The credentials the sandbox accepts (the same token under a new reference)."""
    return SANDBOX_TOKEN if side.key == "github" else side.tracker.sandbox.token


def test_a_poll_refused_for_credentials_raises_the_incident_and_a_good_poll_ends_it(github):
    github.sandbox.outage(401)
    instance_poll(instance_id=github.instance.pk)
    instance = ConnectorInstance.objects.get(pk=github.instance.pk)
    assert instance.auth_error_at is not None and instance_health(instance)["status"] == "error"
    github.sandbox.recover()
    instance_poll(instance_id=github.instance.pk)
    instance.refresh_from_db()
    assert instance.auth_error_at is None and instance_health(instance)["status"] != "error"
    assert list(ActivityLog.objects.filter(action__startswith="connector.credentials_").order_by("id")
                .values_list("action", flat=True)) == ["connector.credentials_failed", "connector.credentials_restored"]


def test_a_read_back_refused_for_credentials_parks_the_event_but_never_puts_the_link_in_error(
        company, coder, monkeypatch, django_capture_on_commit_callbacks, settings):
    from tests.test_connectors_unverified import comment_fixture_for, linked_issue, make_jira

    settings.CONNECTORS = {**settings.CONNECTORS, "RETRY_BASE_SECONDS": 0.0}
    jira = make_jira(company, coder, monkeypatch, django_capture_on_commit_callbacks, signed=False)
    try:
        issue, link = linked_issue(jira)
        jira.sandbox.fail_next(5, "auth")  # every read-back of the unsigned hint is refused (401)
        event = jira.post_payload(comment_fixture_for(issue, body="Any news?"))
        event.refresh_from_db()
        assert (event.status, event.error_category) == ("parked", "provider_auth")
        assert TaskLink.objects.get(pk=link.pk).status == LinkStatus.HEALTHY  # §13.1.2: no link mutation
        instance = ConnectorInstance.objects.get(pk=jira.instance.pk)
        assert instance.auth_error_at is not None and instance_health(instance)["status"] == "error"
        assert ActivityLog.objects.filter(action="connector.credentials_failed").count() == 1
    finally:
        jira.sandbox.stop()
