"""Two-way sync round trips (§10, §11; Appendix A.1/A.2) against the Linear and Jira sandboxes over
real HTTP, mirroring the GitHub round trips of test_connectors_outbound / test_connectors_conflicts:
every tracker write goes through the outbound engine and every tracker change comes back as a
signed webhook posted to the real endpoint. Each test asserts what a user sees on both sides: the
sandbox tracker (comments, title, priority, workflow state) and Paperclip (issue, thread, conflicts)."""
from __future__ import annotations

import json
import re
import uuid

import pytest
from rest_framework.test import APIClient

from connectors.choices import LinkStatus, OutboundKind, OutboundStatus
from connectors.models import Conflict, InboundEvent, OutboundEffect, SyncError, TaskLink
from connectors.providers import adf
from connectors.sandbox import jira as jira_sb
from connectors.sandbox import linear as linear_sb
from connectors.services import outbound
from connectors.services.conflicts import conflict_resolve
from connectors.services.instances import instance_create
from issues.actors import SYSTEM, Actor
from issues.models import Issue
from tests.factories import AgentFactory, MembershipFactory
from tests.jira_sandbox import SANDBOX_EMAIL, SANDBOX_PROJECT
from tests.jira_sandbox import SANDBOX_TOKEN as JIRA_TOKEN
from tests.jira_sandbox import SANDBOX_WEBHOOK_SECRET as JIRA_HOOK
from tests.linear_sandbox import SANDBOX_TEAM, SERVICE_USER
from tests.linear_sandbox import SANDBOX_TOKEN as LINEAR_TOKEN
from tests.linear_sandbox import SANDBOX_WEBHOOK_SECRET as LINEAR_HOOK
from tests.connector_helpers import agent_opens_pr, agent_says, delivery_headers, external_comments, update

PROVIDERS = ("linear", "jira")
EFFECT_MARKER = re.compile(r"paperclip:effect:(\d+)")
LINEAR_TYPES = {"triage": "backlog", "backlog": "backlog", "unstarted": "backlog", "started": "active",
                "completed": "terminal", "canceled": "terminal", "duplicate": "terminal"}
JIRA_CATEGORIES = {"new": "backlog", "indeterminate": "active", "done": "terminal"}
# The operator maps named states for the categories Paperclip projects to (§10.3: only mapped states
# are transitioned to); "Blocked" is deliberately not mapped.
STATE_NAMES = {"In Progress": "active", "In Review": "review", "Done": "terminal"}


class Tracker:
    """One provider's sandbox as a user sees it, plus the webhook hop to Paperclip. Values are given in
    Paperclip's vocabulary (priority ``critical``..``low``) and translated to the provider's."""

    def __init__(self, key: str, sandbox, instance, capture):
        self.key, self.sandbox, self.instance, self.capture = key, sandbox, instance, capture
        self._forwarded = 0

    # --- the tracker, as its users see it -------------------------------------------------------
    def open(self, title: str) -> str:
        """A human opens a task; returns the id Paperclip links by."""
        if self.key == "linear":
            return self.sandbox.create_issue(title, team=SANDBOX_TEAM, description="It crashes.")["id"]
        return self.sandbox.create_issue(title, project=SANDBOX_PROJECT, description="It crashes.")["id"]

    def edit(self, task_id: str, *, title=None, priority=None, description=None):
        """A human edits the task (one webhook)."""
        changes = {}
        if title is not None:
            changes["title" if self.key == "linear" else "summary"] = title
        if description is not None:
            changes["description"] = description
        if priority is not None:
            changes["priority"] = (LINEAR_PRIORITY if self.key == "linear" else JIRA_PRIORITY)[priority]
        self.sandbox.update_issue(task_id, **changes)

    def comment(self, task_id: str, body: str) -> str:
        return str(self.sandbox.add_comment(task_id, body)["id"])

    def task(self, task_id: str) -> dict:
        raw = self.sandbox.issue(task_id)
        if self.key == "linear":
            prio = {v: k for k, v in LINEAR_PRIORITY.items()}.get(raw["priority"])
            return {"title": raw["title"], "state": raw["state"]["name"], "priority": prio}
        fields = raw["fields"]
        prio = {v: k for k, v in JIRA_PRIORITY.items()}.get((fields["priority"] or {}).get("name"))
        return {"title": fields["summary"], "state": fields["status"]["name"], "priority": prio}

    def comments(self, task_id: str) -> list[dict]:
        """Every comment: the text a reader sees and the hidden markers it carries."""
        out = []
        for c in self.sandbox.comments_of(task_id):
            if self.key == "linear":
                text, markers = c["body"], EFFECT_MARKER.findall(c["body"])
                author = c["user"]["id"]
            else:
                text = adf.plain_text(c["body"])
                props = {p["key"]: p["value"] for p in c.get("properties") or ()}
                markers = EFFECT_MARKER.findall(" ".join((props.get("paperclip") or {}).get("markers") or []))
                author = c["author"]["accountId"]
            out.append({"id": str(c["id"]), "text": text, "markers": markers, "author": author})
        return out

    def marked(self, task_id: str) -> list[dict]:
        return [c for c in self.comments(task_id) if c["markers"]]

    def backlinks(self, task_id: str) -> list[str]:
        if self.key == "linear":
            return [a["url"] for a in self.sandbox.attachments_of(task_id)
                    if (a.get("metadata") or {}).get("paperclip") == "backlink"]
        return [lnk["object"]["url"] for lnk in self.sandbox.remote_links_of(task_id)
                if lnk.get("globalId") == "paperclip:backlink"]

    @property
    def service_id(self) -> str:
        return self.sandbox.service_user["id" if self.key == "linear" else "accountId"]

    def fail_next_write(self):
        self.sandbox.fail_next(1, "error", status=502)

    def title_writes(self, task_id: str) -> int:
        """How many title writes the tracker accepted from Paperclip's API user."""
        if self.key == "linear":
            return sum(1 for r in self.sandbox.requests_for("IssueUpdate")
                       if "title" in (r.variables.get("input") or {}) and r.status == 200)
        key = self.sandbox.issue(task_id)["key"]
        return sum(1 for r in self.sandbox.requests_to(rf"^/issue/({key}|{task_id})$", "PUT")
                   if "summary" in ((r.body or {}).get("fields") or {}) and r.status == 204)

    # --- the webhook hop -------------------------------------------------------------------------
    def post(self, delivery):
        headers = delivery_headers(delivery)
        with self.capture(execute=True):
            return APIClient().post(f"/api/connectors/{self.instance.pk}/webhook", data=delivery.body,
                                    content_type="application/json", **headers)

    def forward(self) -> list:
        """Deliver every webhook the tracker produced since the last forward, in order."""
        deliveries = self.sandbox.deliveries[self._forwarded:]
        self._forwarded += len(deliveries)
        responses = [self.post(d) for d in deliveries]
        assert all(r.status_code == 202 for r in responses), [r.content for r in responses]
        return deliveries

    def redeliver(self, delivery):
        """The provider's retry of one delivery: same body and delivery id (Jira: Retry header + 1)."""
        if self.key == "jira":
            delivery = self.sandbox.redeliver(delivery)
            self._forwarded += 1
        return self.post(delivery)

    def relay(self, delivery, *, body: str | None = None, comment_id: str | None = None):
        """The same comment event re-sent by something that obscures authorship (an automation/bridge
        user), optionally with another body or comment id: signed like any delivery."""
        payload = json.loads(delivery.body)
        relay_user = {"linear": {"id": str(uuid.uuid4()), "name": "Relay Bot"},
                      "jira": {"accountId": "relay-5b10", "displayName": "Relay Bot"}}[self.key]
        if self.key == "linear":
            data = payload["data"]
            data["user"], data["userId"], payload["actor"] = relay_user, relay_user["id"], relay_user
            if body is not None:
                data["body"] = body
            if comment_id is not None:
                data["id"] = comment_id
            raw = json.dumps(payload).encode()
            headers = {"Linear-Signature": linear_sb.sign(LINEAR_HOOK, raw), "Linear-Delivery": str(uuid.uuid4()),
                       "Linear-Event": "Comment"}
        else:
            payload["comment"]["author"] = payload["comment"]["updateAuthor"] = relay_user
            if body is not None:
                payload["comment"]["body"] = body
            if comment_id is not None:
                payload["comment"]["id"] = comment_id
            raw = json.dumps(payload).encode()
            headers = {"X-Hub-Signature": jira_sb.sign(JIRA_HOOK, raw),
                       "X-Atlassian-Webhook-Identifier": str(uuid.uuid4())}
        forged = type(delivery)(**{**{f: getattr(delivery, f) for f in delivery.__dataclass_fields__},
                                   "headers": headers, "body": raw})
        return self.post(forged)


LINEAR_PRIORITY = {"critical": 1, "high": 2, "medium": 3, "low": 4}
JIRA_PRIORITY = {"critical": "Highest", "high": "High", "medium": "Medium", "low": "Low"}


def build_instance(key, sandbox, company, agent, monkeypatch, state_names=STATE_NAMES):
    if key == "linear":
        monkeypatch.setenv("PAPERCLIP_SECRET_RT_LINEAR_TOKEN", LINEAR_TOKEN)
        monkeypatch.setenv("PAPERCLIP_SECRET_RT_LINEAR_HOOK", LINEAR_HOOK)
        extra = dict(containers=[SANDBOX_TEAM], state_mapping={"types": LINEAR_TYPES, "states": dict(state_names)},
                     credentials="env:PAPERCLIP_SECRET_RT_LINEAR_TOKEN", webhook_secret="env:PAPERCLIP_SECRET_RT_LINEAR_HOOK",
                     service_account_id=sandbox.service_user["id"])
    else:
        monkeypatch.setenv("PAPERCLIP_SECRET_RT_JIRA_CREDENTIALS", sandbox.credentials)
        monkeypatch.setenv("PAPERCLIP_SECRET_RT_JIRA_HOOK", JIRA_HOOK)
        extra = dict(containers=[SANDBOX_PROJECT],
                     state_mapping={"statuses": dict(state_names), "categories": JIRA_CATEGORIES},
                     credentials="env:PAPERCLIP_SECRET_RT_JIRA_CREDENTIALS", webhook_secret="env:PAPERCLIP_SECRET_RT_JIRA_HOOK",
                     service_account_id=sandbox.service_user["accountId"])
    return instance_create(
        actor=SYSTEM, company=company, name=f"{key}-round-trips", provider_key=key, base_url=sandbox.base_url,
        triage_agent_id=agent.pk, default_sync_mode="bidirectional",
        routing_rules=[{"kind": "default_route", "agentId": agent.pk}], **extra)


@pytest.fixture
def coder(company):
    return AgentFactory(company=company, name="coder")


def make_sandbox(key):
    """The same sandboxes as tests/linear_sandbox.py and tests/jira_sandbox.py (deliveries recorded, not sent)."""
    if key == "linear":
        return linear_sb.LinearSandbox(teams=(SANDBOX_TEAM,), token=LINEAR_TOKEN, service_user=SERVICE_USER,
                                       webhook_secret=LINEAR_HOOK)
    return jira_sb.JiraSandbox(projects=(SANDBOX_PROJECT,), email=SANDBOX_EMAIL, token=JIRA_TOKEN,
                               webhook_secret=JIRA_HOOK)


@pytest.fixture(params=PROVIDERS)
def tracker(request, company, coder, monkeypatch, django_capture_on_commit_callbacks, settings):
    settings.CONNECTORS = {**settings.CONNECTORS, "RETRY_BASE_SECONDS": 0.0}
    with make_sandbox(request.param) as sandbox:
        instance = build_instance(request.param, sandbox, company, coder, monkeypatch)
        yield Tracker(request.param, sandbox, instance, django_capture_on_commit_callbacks)


@pytest.fixture
def linked(tracker):
    """A human's task imported through its webhook: (tracker, external task id, link)."""
    task_id = tracker.open("Crash on start")
    tracker.forward()
    link = TaskLink.objects.get(instance=tracker.instance)
    assert link.external_task_id == task_id and link.sync_mode == "bidirectional"
    # the adapter's type/category defaults map the first state: nothing is reported as unmapped (§7.2)
    assert not SyncError.objects.filter(instance=tracker.instance, category="state_unmapped").exists()
    # the backlink (postBacklink on) went through the same engine: a Linear attachment / Jira remote link
    assert tracker.backlinks(task_id) == [outbound.issue_url(link.issue)]
    tracker.forward()  # whatever the backlink write produced on the tracker
    return tracker, task_id, link


def outcomes_since(instance, before: set) -> list[tuple[str, str]]:
    return list(InboundEvent.objects.filter(instance=instance).exclude(pk__in=before).order_by("id")
                .values_list("status", "outcome"))


# --- 1. a progress (milestone) comment is posted exactly once ---------------------------------------------------
def test_a_progress_comment_is_posted_once_even_when_the_job_retries(linked, coder):
    tracker, task_id, link = linked
    tracker.fail_next_write()  # the provider answers 502: the write did not happen
    agent_opens_pr(tracker, coder, link.issue)
    effect = OutboundEffect.objects.get(link=link, kind=OutboundKind.COMMENT, source_id__startswith="artifact:")
    assert (effect.status, effect.attempts) == (OutboundStatus.DONE, 2)  # failed once, the retry wrote it
    assert SyncError.objects.filter(link=link, message__contains="Outbound comment").count() == 1
    [posted] = tracker.marked(task_id)
    # what a tracker user reads: the milestone line with agent attribution and the issue link
    # (Jira's ADF keeps the address as a link mark, not as text)
    assert "PR opened: " in posted["text"] and "Fix the config loader" in posted["text"]
    assert "coder via Paperclip" in posted["text"] and link.issue.identifier in posted["text"]
    assert posted["author"] == tracker.service_id and posted["markers"] == [str(effect.pk)]
    if tracker.key == "jira":
        # ADF cannot hold an HTML comment: the marker is invisible (a comment property), never body text
        assert "<!--" not in posted["text"] and "paperclip:effect" not in posted["text"]
    # the worker died after the provider accepted the write, before the outcome was saved: the retried
    # job finds its marker on the tracker (Jira: through the comment properties) and posts nothing
    OutboundEffect.objects.filter(pk=effect.pk).update(status=OutboundStatus.PENDING, next_attempt_at=None)
    assert outbound.effect_deliver(effect_id=effect.pk) == "done"
    assert outbound.effect_deliver(effect_id=effect.pk) == "not_pending"
    assert [c["id"] for c in tracker.marked(task_id)] == [posted["id"]]
    effect.refresh_from_db()
    assert effect.external_ref == posted["id"] and effect.attempts == 3


def test_a_mirrored_agent_comment_keeps_its_formatting_and_hidden_marker(linked, coder):
    tracker, task_id, link = linked
    TaskLink.objects.filter(pk=link.pk).update(write_policy={"mirrorAgentComments": True})
    body = "Root cause found in **config.py**:\n\n- the loader ignores `HOME`\n- the fallback path is wrong"
    comment = agent_says(tracker, coder, link.issue, body)
    effect = OutboundEffect.objects.get(link=link, source_id=f"comment:{comment.pk}")
    assert effect.status == OutboundStatus.DONE
    [posted] = tracker.marked(task_id)
    assert posted["markers"] == [str(effect.pk)] and "coder via Paperclip" in posted["text"]
    if tracker.key == "jira":
        [raw] = [c for c in tracker.sandbox.comments_of(task_id) if str(c["id"]) == posted["id"]]
        nodes = json.dumps(raw["body"])
        # real ADF: a bullet list, bold and code marks; the marker is not in the document at all
        assert '"bulletList"' in nodes and '"strong"' in nodes and '"code"' in nodes and "paperclip:" not in nodes
    # read back through the adapter (what the retry's marker lookup sees), the Markdown is intact
    from connectors.providers.base import ExternalTaskRef
    from connectors.services.common import adapter_for

    items = adapter_for(tracker.instance).list_comments(ExternalTaskRef(task_id, link.external_key), None).items
    [mine] = [c for c in items if c.external_comment_id == posted["id"]]
    assert body in mine.body and outbound.marker(effect.pk) in mine.body
    assert mine.author.is_connector_service_account


# --- 2. the echo of our own comment --------------------------------------------------------------
def test_the_echo_of_our_comment_never_becomes_a_paperclip_comment(linked, coder):
    tracker, task_id, link = linked
    agent_opens_pr(tracker, coder, link.issue)
    [posted] = tracker.marked(task_id)
    before = set(InboundEvent.objects.values_list("pk", flat=True))
    [echo] = [d for d in tracker.forward() if str(posted["id"]) in d.body.decode()]
    assert outcomes_since(tracker.instance, before) == [("dropped", "the connector's own comment (echo)")]
    # a bridge that re-sends it under another author: dropped by the recent outbound ref (same comment id,
    # marker stripped) and by the marker (another comment id, marker kept)
    before = set(InboundEvent.objects.values_list("pk", flat=True))
    tracker.relay(echo, body="PR opened: #12 (relayed)")
    tracker.relay(echo, body=f"copied\n\n<!-- paperclip:effect:{posted['markers'][0]} -->", comment_id="777001")
    assert outcomes_since(tracker.instance, before) == [
        ("dropped", "matches a recently issued outbound write (echo)"),
        ("dropped", "mirrored comment marker (loop prevention)")]
    assert not external_comments(link.issue).exists()
    # the control: a person's comment on the same task does arrive in the Paperclip thread
    human = tracker.comment(task_id, "Thanks, that fixed it for me.")
    tracker.forward()
    [imported] = external_comments(link.issue)
    assert imported.provenance["externalCommentId"] == human and "that fixed it" in imported.body


# --- 3. both sides changed: one conflict --------------------------------------------------------
@pytest.mark.parametrize("field,paperclip_value,tracker_value", [
    ("title", "Paperclip title", "Tracker title"),
    ("priority", "low", "high"),
])
def test_a_field_changed_on_both_sides_is_one_conflict_even_on_redelivery(
        linked, field, paperclip_value, tracker_value):
    tracker, task_id, link = linked
    base_value = getattr(link.issue, field)
    update(tracker, link.issue, **{field: paperclip_value})
    tracker.edit(task_id, **{field: tracker_value})
    [delivery] = tracker.forward()
    conflict = Conflict.objects.get(link=link)
    assert (conflict.kind, conflict.field, conflict.status) == ("field", field, "open")
    assert conflict.paperclip_value == paperclip_value
    if field == "title":
        assert (conflict.base_value, conflict.external_value) == (base_value, tracker_value)
    else:  # the base/external side in the normalized 0 (most urgent) .. 4 scale
        assert conflict.external_value == 1
    events = InboundEvent.objects.filter(instance=tracker.instance).count()
    assert tracker.redeliver(delivery).status_code == 202  # the provider retries the same delivery
    assert InboundEvent.objects.filter(instance=tracker.instance).count() == events
    tracker.edit(task_id, description="More detail from the reporter.")  # a new event, same divergence
    tracker.forward()
    assert Conflict.objects.filter(link=link).count() == 1
    link.refresh_from_db()
    assert link.status == LinkStatus.CONFLICT and getattr(link.issue, field) == paperclip_value
    # open conflicts never block other fields: the description followed the tracker
    assert "More detail from the reporter." in link.issue.description
    assert tracker.task(task_id)[field] == tracker_value  # nothing was pushed over the human's edit


def test_a_paperclip_edit_is_still_a_conflict_after_an_unrelated_tracker_event(linked):
    tracker, task_id, link = linked
    update(tracker, link.issue, title="Paperclip title")
    tracker.edit(task_id, description="More detail from the reporter.")  # touches another field only
    tracker.forward()
    tracker.edit(task_id, title="Tracker title")
    tracker.forward()
    link.refresh_from_db()
    # §11.1: changed on both sides since the base -> a conflict, never a silent overwrite of Paperclip's edit
    assert link.issue.title == "Paperclip title"
    assert list(Conflict.objects.filter(link=link).values_list("field", "status")) == [("title", "open")]


def test_a_tracker_edit_that_matches_paperclips_edit_settles_the_field(linked):
    tracker, task_id, link = linked
    update(tracker, link.issue, title="Agreed title")
    tracker.edit(task_id, title="Agreed title")  # a person makes the same edit in the tracker
    tracker.forward()
    tracker.edit(task_id, title="Later tracker title")  # the field is in sync again: a plain tracker change
    tracker.forward()
    link.refresh_from_db()
    assert link.issue.title == "Later tracker title"
    assert not Conflict.objects.filter(link=link).exists()


# --- 4. each resolution advances the base ----------------------------------------------------------
RESOLUTIONS = {
    # action: (Paperclip title after, tracker title after, title writes to the tracker)
    "keep_paperclip": ("Paperclip title", "Paperclip title", 1),
    "keep_external": ("Tracker title", "Tracker title", 0),
    "merge_manual": ("Merged title", "Merged title", 1),
    "dismiss": ("Paperclip title", "Tracker title", 0),
    "unlink": ("Paperclip title", "Tracker title", 0),
}


@pytest.mark.parametrize("action", sorted(RESOLUTIONS))
def test_each_resolution_advances_the_base_and_is_not_redetected(linked, company, action):
    tracker, task_id, link = linked
    issue_title, tracker_title, writes = RESOLUTIONS[action]
    update(tracker, link.issue, title="Paperclip title")
    tracker.edit(task_id, title="Tracker title")
    [delivery] = tracker.forward()
    conflict = Conflict.objects.get(link=link, status="open")
    operator = MembershipFactory(company=company, role="operator").user
    with tracker.capture(execute=True):
        row = conflict_resolve(actor=Actor(user=operator), conflict=conflict, action=action,
                               merged_value="Merged title" if action == "merge_manual" else None,
                               idempotency_key=f"rt-{action}")
    assert row.status == ("dismissed" if action == "dismiss" else "resolved") and row.resolution == action
    assert tracker.task(task_id)["title"] == tracker_title
    assert tracker.title_writes(task_id) == writes
    effects = OutboundEffect.objects.filter(link=link, source_id=f"conflict:{conflict.pk}")
    if writes:
        [effect] = effects
        assert (effect.kind, effect.status, effect.attempts) == (OutboundKind.FIELDS, OutboundStatus.DONE, 1)
    else:
        assert not effects.exists()
    link.refresh_from_db()
    if action != "unlink":
        assert link.status == LinkStatus.HEALTHY
        assert link.base_snapshot["paperclip"]["title"] == issue_title
    # the next inbound events: the tracker's echo of our write, the provider retrying the event that
    # raised the conflict, and a person's unrelated edit that still carries the tracker's title
    tracker.forward()
    tracker.redeliver(delivery)
    tracker.edit(task_id, description="Steps to reproduce: start it.")
    tracker.forward()
    assert not Conflict.objects.filter(status="open").exists()
    assert Conflict.objects.filter(link=link).count() == 1
    link.refresh_from_db()
    issue = Issue.objects.get(pk=link.issue_id)
    assert issue.title == issue_title and tracker.task(task_id)["title"] == tracker_title
    assert tracker.title_writes(task_id) == writes  # written once, never again
    if action == "unlink":
        # unlink severs sync (§6.4): the record stays, nothing flows either way any more
        assert link.status == LinkStatus.UNLINKED
        assert not TaskLink.objects.filter(instance=tracker.instance).exclude(status=LinkStatus.UNLINKED).exists()
        assert "Steps to reproduce" not in issue.description
        assert Issue.objects.filter(company=company).count() == 1
    else:
        assert link.status == LinkStatus.HEALTHY and "Steps to reproduce" in issue.description


@pytest.mark.parametrize("action,value", [("keep_paperclip", "low"), ("merge_manual", "critical")])
def test_a_priority_resolution_writes_the_providers_priority_once(linked, company, action, value):
    tracker, task_id, link = linked
    update(tracker, link.issue, priority="low")
    tracker.edit(task_id, priority="high")
    tracker.forward()
    conflict = Conflict.objects.get(link=link, field="priority", status="open")
    operator = MembershipFactory(company=company, role="operator").user
    with tracker.capture(execute=True):
        conflict_resolve(actor=Actor(user=operator), conflict=conflict, action=action,
                         merged_value=value if action == "merge_manual" else None)
    # Linear 1..4 / Jira Highest..Low: the tracker shows the same priority Paperclip does
    assert tracker.task(task_id)["priority"] == value
    effect = OutboundEffect.objects.get(link=link, source_id=f"conflict:{conflict.pk}")
    assert (effect.status, effect.attempts) == (OutboundStatus.DONE, 1)
    tracker.forward()  # our own write comes back: dropped
    tracker.edit(task_id, description="Seen on 2.3 as well.")
    tracker.forward()
    link.refresh_from_db()
    assert link.issue.priority == value and link.status == LinkStatus.HEALTHY
    assert not Conflict.objects.filter(status="open").exists()


# --- 5. status projection ----------------------------------------------------------------------------
def jira_transition_calls(sandbox, key):
    """(GET|POST, transition id posted) for every transitions call of the issue, in order."""
    return [(r.method, ((r.body or {}).get("transition") or {}).get("id"))
            for r in sandbox.requests_to(rf"^/issue/{key}/transitions$")]


def test_status_projection_moves_mapped_states_and_gates_closure(linked):
    tracker, task_id, link = linked
    key = link.external_key
    issue = update(tracker, link.issue, status="in_progress")
    assert tracker.task(task_id)["state"] == "In Progress"  # the operator-mapped active state
    effect = OutboundEffect.objects.get(link=link, kind=OutboundKind.STATE)
    assert effect.status == OutboundStatus.DONE and effect.payload["stateName"] == "In Progress"
    if tracker.key == "jira":
        # A.2: transition ids are resolved at apply time from the issue's available transitions
        assert jira_transition_calls(tracker.sandbox, key) == [("GET", None), ("POST", "21")]
    # our own transition comes back as a webhook: an echo, not a change and not a conflict
    before = set(InboundEvent.objects.values_list("pk", flat=True))
    tracker.forward()
    assert ("dropped", "the connector's own change (echo)") in outcomes_since(tracker.instance, before)
    assert not Conflict.objects.exists()

    issue = update(tracker, issue, status="in_review")  # a review state is mapped: the handoff transition
    assert tracker.task(task_id)["state"] == "In Review"
    assert any("Ready for review." in c["text"] for c in tracker.marked(task_id))
    if tracker.key == "jira":
        assert jira_transition_calls(tracker.sandbox, key)[2:] == [("GET", None), ("POST", "31")]
    tracker.forward()

    # done while fieldPolicy.state is shared (the default): a completion comment, the state stays
    issue = update(tracker, issue, status="done")
    assert tracker.task(task_id)["state"] == "In Review"
    done = [c for c in tracker.marked(task_id) if "Closing the task is left to you" in c["text"]]
    assert len(done) == 1 and "coder via Paperclip" in done[0]["text"]
    assert OutboundEffect.objects.filter(link=link, kind=OutboundKind.STATE).count() == 2

    # fieldPolicy.state=paperclip permits Paperclip-side closure: the terminal state, through the engine
    TaskLink.objects.filter(pk=link.pk).update(field_policy={**link.field_policy, "state": "paperclip"})
    issue = update(tracker, issue, status="todo")
    update(tracker, issue, status="done")
    assert tracker.task(task_id)["state"] == "Done"
    if tracker.key == "jira":
        assert jira_transition_calls(tracker.sandbox, key)[4:] == [("GET", None), ("POST", "51")]
    tracker.forward()
    link.refresh_from_db()
    assert not Conflict.objects.exists() and link.external_state_category == "terminal"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_mapping_by_type_or_category_only_still_moves_the_task(
        provider, company, coder, monkeypatch, django_capture_on_commit_callbacks, settings):
    """A team that keeps the provider's defaults (Linear state types, Jira status categories) names no
    state at all: in_progress still moves the task to the workflow's started state (not "Todo",
    though Linear's unstarted type is active too), and permitted closure to its completed state."""
    settings.CONNECTORS = {**settings.CONNECTORS, "RETRY_BASE_SECONDS": 0.0}
    with make_sandbox(provider) as sandbox:
        instance = build_instance(provider, sandbox, company, coder, monkeypatch, state_names={})
        tracker = Tracker(provider, sandbox, instance, django_capture_on_commit_callbacks)
        task_id = tracker.open("Crash on start")
        tracker.forward()
        link = TaskLink.objects.get(instance=instance)
        TaskLink.objects.filter(pk=link.pk).update(field_policy={**link.field_policy, "state": "paperclip"})
        issue = update(tracker, link.issue, status="in_progress")
        assert tracker.task(task_id)["state"] == "In Progress"
        tracker.forward()
        update(tracker, issue, status="done")
        assert tracker.task(task_id)["state"] == "Done"
        tracker.forward()
        link.refresh_from_db()
        assert link.external_state_name == "Done" and link.external_state_category == "terminal"
        assert not Conflict.objects.exists()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_states_the_mapping_names_only_by_type_or_category_are_found_in_the_live_workflow(
        provider, company, coder, monkeypatch, django_capture_on_commit_callbacks, settings):
    """The operator named only the active state. The effective mapping still knows a review state
    (Linear's and Jira's default "In Review" -> review) and, on Jira, a blocked one ("Blocked"): those
    are found in the task's live workflow at delivery. A status with no mapped state anywhere (blocked
    on Linear: the team has no such state) is projected as a comment, never a transition."""
    settings.CONNECTORS = {**settings.CONNECTORS, "RETRY_BASE_SECONDS": 0.0}
    with make_sandbox(provider) as sandbox:
        instance = build_instance(provider, sandbox, company, coder, monkeypatch,
                                  state_names={"In Progress": "active"})
        tracker = Tracker(provider, sandbox, instance, django_capture_on_commit_callbacks)
        task_id = tracker.open("Crash on start")
        tracker.forward()
        link = TaskLink.objects.get(instance=instance)
        issue = update(tracker, link.issue, status="in_progress")
        assert tracker.task(task_id)["state"] == "In Progress"
        tracker.forward()
        issue = update(tracker, issue, status="in_review")
        assert tracker.task(task_id)["state"] == "In Review"
        tracker.forward()
        update(tracker, issue, status="blocked")
        bodies = [c["text"] for c in tracker.marked(task_id)]
        assert "Review requested" in bodies[0]
        states = list(OutboundEffect.objects.filter(link=link, kind=OutboundKind.STATE, status=OutboundStatus.DONE)
                      .order_by("id").values_list("external_ref", flat=True))
        if provider == "jira":
            assert tracker.task(task_id)["state"] == "Blocked" and len(bodies) == 1
            assert states == ["In Progress", "In Review", "Blocked"]
        else:
            assert tracker.task(task_id)["state"] == "In Review"  # no blocked state in the team: a comment
            assert len(bodies) == 2 and "Status in Paperclip is now 'blocked'" in bodies[1]
            assert states == ["In Progress", "In Review"]
        tracker.forward()
        link.refresh_from_db()
        assert not Conflict.objects.exists()  # our own moves came back as echoes, not as changes
