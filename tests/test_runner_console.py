"""The console's run page for PRP runs: the live session snapshot (issues.runner.selectors) with
htmx polling while the run is live, the goal card with only the advertised controls, the
commands, credentials, activity and the host's decision; the runtime request answer form on the
issue page. Another company's run, panel, goal action or request is a 404."""
import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from issues.actors import Actor
from issues.models import HeartbeatRun, Interaction, RunnerCommand, RunnerEvent, RunnerSession
from issues.runner import requests, selectors
from issues.services.runs import issue_run_stop, run_finish
from tests.factories import IssueFactory, MembershipFactory, RunFactory
from tests.runner_helpers import capabilities, envelope, runner_run, source_key
from tests.test_runner_goals import GOAL, goals_capability
from tests.test_runner_requests import PERMISSION, QUESTIONS

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def text(response) -> str:
    return response.content.decode()


def store(run, session, events):
    for env in events:
        position = session.event_count + 1
        RunnerEvent.objects.create(run=run, position=position, source_key=source_key(),
                                   source_event_id=env["sourceEventId"], source_seq=env["sourceSeq"],
                                   event_type=env["eventType"], digest=f"{position:064d}", envelope=env)
        session.event_count = position
    session.save()


def item_events(run, first=1):
    return [envelope(first, "turn.started", run=run, version=2, turnId="turn_1"),
            envelope(first + 1, "item.started", {"kind": "assistant_message", "text": ""}, run=run, version=2,
                     turnId="turn_1", itemId="item_1"),
            envelope(first + 2, "item.delta", {"text": "Reading the parser. "}, run=run, version=2, turnId="turn_1",
                     itemId="item_1")]


class World:
    def __init__(self):
        self.run, _key = runner_run()
        self.company = self.run.company
        self.issue = IssueFactory(company=self.company, assignee_agent=self.run.agent, status="in_progress",
                                  title="Parser work")
        HeartbeatRun.objects.filter(pk=self.run.pk).update(issue=self.issue)
        self.run.refresh_from_db()
        caps = capabilities(2)
        caps["sessionGoals"] = goals_capability(actions=("set", "clear"))
        self.session = RunnerSession.objects.create(
            run=self.run, company=self.company, protocol_min=1, protocol_max=2, protocol_version=2,
            capabilities=caps, runner_instance_id="runner_console", hello_at=timezone.now(), goal=GOAL,
            credentials={"codex/harness-auth": {"provider": "codex", "bindingId": "harness-auth", "revision": 3,
                                                "detection": "credential_store"}},
            activity={"paperclip.cli": {"issue.commented": {"count": 2, "lastSourceEventId": "e9"}}},  # as projected
            decision={"applied": "in_review", "reason": "review required"})
        store(self.run, self.session, item_events(self.run))
        self.users = {role: MembershipFactory(company=self.company, role=role).user for role in ("operator", "viewer")}

    def client(self, role="operator") -> Client:
        client = Client()
        client.force_login(self.users[role])
        return client


@pytest.fixture
def world(db):
    return World()


def run_page(world, role="operator"):
    return world.client(role).get(reverse("console:run-detail", args=[world.run.pk]))


def test_the_run_page_shows_the_live_snapshot(world):
    response = run_page(world)
    assert response.status_code == 200
    page = text(response)
    assert 'id="runner-session"' in page and "Runner session" in page
    assert "v2 negotiated" in page and "runner_console" in page
    assert "Reading the parser." in page  # the item's accumulated text
    assert "turn_1" in page and "runner:runner_test" in page  # active turn, cursors
    assert "turn.started" in page and "item.delta" in page  # timeline
    assert "Ship the parser" in page and "working now" in page  # the goal
    assert "harness-auth" in page and "credential_store" in page  # credential namespace
    assert "issue.commented" in page  # activity counts
    assert "in_review" in page and "review required" in page  # the host's decision
    # htmx polls the panel while the run is live.
    assert f'hx-get="{reverse("console:run-runner", args=[world.run.pk])}?fp=' in page


def test_only_the_advertised_goal_controls_are_shown(world):
    page = text(run_page(world))
    assert 'value="clear"' in page and 'id="runner-goal-set"' in page  # set and clear advertised
    assert 'value="pause"' not in page  # active goal, but pause not advertised
    world.session.goal_capability = goals_capability(availability="policy_disabled")
    world.session.save()
    page = text(run_page(world))
    assert 'value="clear"' not in page and 'id="runner-goal-set"' not in page
    assert "policy_disabled" in page


def test_viewers_see_no_controls(world):
    page = text(run_page(world, "viewer"))
    assert "Ship the parser" in page and 'value="clear"' not in page and 'id="runner-goal-set"' not in page


def test_a_plain_run_page_has_no_runner_panel(world):
    run = RunFactory(agent=world.run.agent, company=world.company, status="running")
    response = world.client().get(reverse("console:run-detail", args=[run.pk]))
    assert response.status_code == 200 and 'id="runner-session"' not in text(response)
    assert world.client().get(reverse("console:run-runner", args=[run.pk]), **HTMX).status_code == 404


def test_the_panel_polls_and_stops_when_the_run_ends(world):
    client = world.client()
    url = reverse("console:run-runner", args=[world.run.pk])
    first = client.get(url, **HTMX)
    assert first.status_code == 200 and "<html" not in text(first) and 'id="runner-session"' in text(first)
    fingerprint = selectors.runner_fingerprint(world.run)
    assert client.get(f"{url}?fp={fingerprint}", **HTMX).status_code == 204  # nothing new
    store(world.run, world.session, [envelope(4, "item.delta", {"text": "Done."}, run=world.run, version=2,
                                              turnId="turn_1", itemId="item_1")])
    changed = client.get(f"{url}?fp={fingerprint}", **HTMX)
    assert changed.status_code == 200 and "Reading the parser. Done." in text(changed)
    run_finish(run=world.run, status="succeeded")
    final = client.get(f"{url}?fp={fingerprint}", **HTMX)
    assert final.status_code == 286 and "hx-trigger" not in text(final)


def test_the_snapshot_is_cached_by_event_count(world, django_assert_max_num_queries):
    selectors.session_snapshot(world.session)
    with django_assert_max_num_queries(0):
        snapshot, error = selectors.session_snapshot(world.session)
    assert error == "" and snapshot["items"][0]["text"] == "Reading the parser. "


def test_the_snapshot_is_bounded(world, monkeypatch):
    monkeypatch.setattr(selectors, "SNAPSHOT_MAX_EVENTS", 2)
    view = selectors.runner_run_view(world.run)
    assert view["snapshot_bounded"] and view["timeline_count"] == 2
    assert "covers the first 2 of 3 events" in text(run_page(world))


def test_commands_are_listed_with_their_status(world):
    issue_run_stop(actor=Actor(user=world.users["operator"]), issue=world.issue)
    page = text(run_page(world))
    assert 'id="command-1"' in page and "turn.interrupt" in page and "Pending" in page


def test_the_console_sends_goal_actions(world):
    client = world.client()
    url = reverse("console:run-goal", args=[world.run.pk])
    response = client.post(url, {"action": "set", "objective": "Write the tests", "tokenBudget": "900"})
    assert response.status_code == 302 and response["Location"].endswith("#runner-goal")
    [command] = RunnerCommand.objects.filter(run=world.run)
    assert command.envelope["payload"] == {"objective": "Write the tests", "status": "active", "tokenBudget": 900}
    refused = client.post(url, {"action": "pause"}, follow=True)
    assert "does not support the goal action" in text(refused)
    assert RunnerCommand.objects.filter(run=world.run).count() == 1


def test_goal_actions_need_csrf_and_the_operator_role(world):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(world.users["operator"])
    url = reverse("console:run-goal", args=[world.run.pk])
    assert strict.post(url, {"action": "clear"}).status_code == 403
    assert world.client("viewer").post(url, {"action": "clear"}).status_code == 403
    assert world.client().get(url).status_code == 405
    assert not RunnerCommand.objects.exists()


def test_another_companys_run_is_404(world):
    stranger = Client()
    stranger.force_login(MembershipFactory().user)
    for name in ("console:run-detail", "console:run-runner"):
        assert stranger.get(reverse(name, args=[world.run.pk])).status_code == 404
    assert stranger.post(reverse("console:run-goal", args=[world.run.pk]), {"action": "clear"}).status_code == 404
    interaction = requests.project_request_event(
        session=world.session, event=envelope(9, "runtime_request.created", {"request": PERMISSION}, run=world.run,
                                              version=2))
    assert stranger.post(reverse("console:runtime-request-answer", args=[interaction.pk]),
                         {"status": "accepted"}).status_code == 404
    assert not RunnerCommand.objects.exists()


def test_the_issue_page_answers_a_permission_request(world):
    interaction = requests.project_request_event(
        session=world.session, event=envelope(9, "runtime_request.created", {"request": PERMISSION}, run=world.run,
                                              version=2))
    client = world.client()
    page = text(client.get(reverse("console:issue-detail", args=[world.issue.identifier])))
    assert PERMISSION["prompt"] in page and ">Allow</button>" in page and ">Deny</button>" in page
    assert reverse("console:runtime-request-answer", args=[interaction.pk]) in page
    response = client.post(reverse("console:runtime-request-answer", args=[interaction.pk]), {"status": "accepted"})
    assert response.status_code == 302
    [command] = RunnerCommand.objects.filter(run=world.run, command_type="request.resolve")
    assert command.envelope["payload"]["response"] == {"decision": "allow"} and command.interaction_id == interaction.pk
    page = text(client.get(reverse("console:run-detail", args=[world.run.pk])))
    assert "request.resolve" in page and PERMISSION["prompt"] in page


def test_the_issue_page_answers_a_question_set(world):
    interaction = requests.project_request_event(
        session=world.session, event=envelope(9, "runtime_request.created", {"request": QUESTIONS}, run=world.run,
                                              version=2))
    client = world.client()
    page = text(client.get(reverse("console:issue-detail", args=[world.issue.identifier])))
    assert 'name="q:mode"' in page and 'name="q:tags:custom"' in page and 'name="q:name"' in page
    url = reverse("console:runtime-request-answer", args=[interaction.pk])
    refused = client.post(url, {"status": "answered", "q:mode": "safe"}, follow=True)
    assert "does not fit" in text(refused)
    client.post(url, {"status": "answered", "q:mode": "safe", "q:tags": ["a", "b"], "q:tags:custom": "",
                      "q:name": "trace-9"})
    interaction.refresh_from_db()
    assert interaction.status == "answered"
    [command] = RunnerCommand.objects.filter(run=world.run, command_type="request.resolve")
    assert command.envelope["payload"]["response"]["answers"] == {
        "mode": {"answers": ["safe"]}, "tags": {"answers": ["a", "b"]}, "name": {"answers": ["trace-9"]}}
    page = text(client.get(reverse("console:issue-detail", args=[world.issue.identifier])))
    assert Interaction.objects.get(pk=interaction.pk).get_status_display() in page
