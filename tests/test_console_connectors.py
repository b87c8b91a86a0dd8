"""Connector console pages: instance list, health page with its htmx poller (286 when idle),
pause/resume (admin only), parked event replay, the issue page's link panel and its actions, the
conflict queue with two-step resolution through ``conflict_resolve``, the dashboard panel — with
the Django test client against the real database."""
import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from connectors.models import Conflict, ConnectorInstance, InboundEvent, Intervention, SyncError, TaskLink
from connectors.services.instances import instance_create
from issues.actors import SYSTEM
from issues.models import ActivityLog
from tests.factories import AgentFactory, CompanyFactory, IssueFactory, MembershipFactory

HTMX = {"HTTP_HX_REQUEST": "true"}
FILTER = {**HTMX, "HTTP_HX_TRIGGER": "conflict-filters"}


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def referenced_secrets(monkeypatch):
    """The variables these connectors reference exist, as an operator's deployment would export them
    (a reference that resolves to nothing is refused when the connector is created)."""
    for name in ("GH_TOKEN_FOR_TESTS", "GH_SECRET_FOR_TESTS", "GH_HOOK", "GH_TOKEN", "GITHUB_SANDBOX_TOKEN",
                 "GITHUB_SANDBOX_WEBHOOK_SECRET"):
        monkeypatch.setenv(f"PAPERCLIP_SECRET_{name}", f"test-value-{name.lower()}")


def text(response) -> str:
    return response.content.decode()


def make_instance(company, name="GitHub demo", **fields):
    return instance_create(actor=SYSTEM, company=company, name=name, provider_key="github_issues",
                           credentials="env:PAPERCLIP_SECRET_GH_TOKEN_FOR_TESTS", webhook_secret="env:PAPERCLIP_SECRET_GH_SECRET_FOR_TESTS",
                           containers=["demo/app"], **fields)


def make_link(instance, issue, n=1, **fields):
    return TaskLink.objects.create(
        company=instance.company, instance=instance, provider_key=instance.provider_key, issue=issue,
        external_task_id=f"demo/app#{n}", external_key=f"demo/app#{n}", external_title=f"Task {n}",
        external_url=f"https://example.invalid/demo/app/issues/{n}", external_state_name="open",
        external_state_category="active", status=fields.pop("status", "healthy"),
        routing={"kind": "label", "ruleId": 7, "agentName": "Linus", "reason": "label 'backend'"}, **fields)


def make_event(instance, status, n, task="demo/app#1", **fields):
    return InboundEvent.objects.create(instance=instance, company=instance.company, idempotency_key=f"k-{n}",
                                       kind="task.upserted", external_task_id=task, status=status, **fields)


def make_conflict(link, field="title", external="Fix the login page", paperclip="Fix the sign-in page"):
    return Conflict.objects.create(company=link.company, instance=link.instance, link=link, kind="field",
                                   field=field, base_value="Fix login", external_value=external,
                                   paperclip_value=paperclip, actors={"external": "octocat", "paperclip": "Linus"})


class World:
    def __init__(self):
        self.company = CompanyFactory(name="Acme")
        self.users = {role: MembershipFactory(company=self.company, role=role).user
                      for role in ("owner", "admin", "operator", "viewer")}
        self.agent = AgentFactory(company=self.company, name="Linus")
        self.instance = make_instance(self.company)
        self.issue = IssueFactory(company=self.company, title="Fix the sign-in page", assignee_agent=self.agent)
        self.link = make_link(self.instance, self.issue)

    def client(self, role) -> Client:
        client = Client()
        client.force_login(self.users[role])
        return client


@pytest.fixture
def world(db):
    return World()


# --- instance list and health -----------------------------------------------------------------------


def test_instance_list_shows_badges_counts_and_pause_only_for_admins(world):
    make_event(world.instance, "parked", 1)
    make_conflict(world.link)
    page = text(world.client("owner").get(reverse("connectors_console:instance-list")))
    assert "GitHub demo" in page and "health-degraded" in page  # a parked event degrades health
    assert reverse("connectors_console:instance-pause", args=[world.instance.pk]) in page
    viewer_page = text(world.client("operator").get(reverse("connectors_console:instance-list")))
    assert "GitHub demo" in viewer_page
    assert reverse("connectors_console:instance-pause", args=[world.instance.pk]) not in viewer_page


def test_instance_list_query_count_is_constant(world):
    client = world.client("owner")
    url = reverse("connectors_console:instance-list")
    client.get(url)
    with CaptureQueriesContext(connection) as few:
        assert client.get(url).status_code == 200
    for n in range(8):
        instance = make_instance(world.company, name=f"extra {n}")
        make_event(instance, "failed", n + 100)
        make_conflict(make_link(instance, IssueFactory(company=world.company), n=n + 10))
    with CaptureQueriesContext(connection) as many:
        assert client.get(url).status_code == 200
    assert len(many) == len(few)


def test_health_page_shows_queue_retries_parked_errors_and_cursors(world):
    make_event(world.instance, "pending", 1)
    make_event(world.instance, "failed", 2, attempts=2, error_category="provider_status")
    parked = make_event(world.instance, "parked", 3, attempts=5, error_category="apply_failed",
                        error_message="boom <script>")
    SyncError.objects.create(instance=world.instance, company=world.company, category="provider_rate_limited",
                             message="429 from the provider")
    world.instance.cursors.create(scope="demo/app", cursor="2026-11-29T00:00:00Z")
    page = text(world.client("viewer").get(reverse("connectors_console:instance-detail", args=[world.instance.pk])))
    assert 'id="queue-depth"' in page and "inbound queue" in page
    assert "Scheduled retries" in page and "provider_status" in page
    assert f'id="event-{parked.pk}"' in page and "boom &lt;script&gt;" in page
    assert "429 from the provider" in page and "provider_rate_limited" in page
    assert "demo/app" in page and "Lag" in page
    assert "env:PAPERCLIP_SECRET_GH_TOKEN_FOR_TESTS" in page  # references are shown, never values
    assert "Replay" not in page  # a viewer has no action buttons
    assert 'hx-trigger="every 5s"' in page


def test_health_poller_returns_a_fragment_and_stops_with_286_when_idle(world):
    client = world.client("viewer")
    url = reverse("connectors_console:instance-live", args=[world.instance.pk])
    first = client.get(url, **HTMX)
    assert first.status_code == 200
    body = text(first)
    assert body.lstrip().startswith('<div id="health-live"') and "<html" not in body
    fp = first.content.decode().split('data-fingerprint="')[1].split('"')[0]
    # Unchanged and nothing in flight: after IDLE_POLLS polls the answer is 286 without a trigger.
    from connectors.console.views import IDLE_POLLS

    response = client.get(url, {"fp": fp, "idle": IDLE_POLLS - 1}, **HTMX)
    assert response.status_code == 286
    assert "hx-trigger" not in text(response).split("Resume live refresh")[0].split("<p")[0]
    assert "Live refresh stopped" in text(response)
    # Something changed: polling goes on, idle counter restarts.
    make_event(world.instance, "pending", 9)
    response = client.get(url, {"fp": fp, "idle": IDLE_POLLS - 1}, **HTMX)
    assert response.status_code == 200 and "idle=0" in text(response)
    # Unchanged but the queue is not empty: keeps polling until MAX_IDLE_POLLS.
    fp2 = text(response).split('data-fingerprint="')[1].split('"')[0]
    assert client.get(url, {"fp": fp2, "idle": IDLE_POLLS + 3}, **HTMX).status_code == 200
    from connectors.console.views import MAX_IDLE_POLLS

    assert client.get(url, {"fp": fp2, "idle": MAX_IDLE_POLLS}, **HTMX).status_code == 286


def test_pause_and_resume_need_admin_and_are_audited(world):
    url = reverse("connectors_console:instance-pause", args=[world.instance.pk])
    assert world.client("operator").post(url, {"idempotency_key": "k1"}).status_code == 403
    world.instance.refresh_from_db()
    assert world.instance.status == "active"
    response = world.client("admin").post(url, {"idempotency_key": "k1"})
    assert response.status_code == 302
    world.instance.refresh_from_db()
    assert world.instance.status == "paused"
    assert ActivityLog.objects.filter(action="connector.instance.pause", actor_user=world.users["admin"]).exists()
    # The same form submitted twice acts once.
    world.client("admin").post(url, {"idempotency_key": "k1"})
    assert Intervention.objects.filter(idempotency_key="k1").count() == 1
    world.client("owner").post(reverse("connectors_console:instance-resume", args=[world.instance.pk]),
                               {"idempotency_key": "k2"})
    world.instance.refresh_from_db()
    assert world.instance.status == "active"


def test_replay_a_parked_event(world):
    event = make_event(world.instance, "parked", 1, attempts=5)
    url = reverse("connectors_console:event-replay", args=[event.pk])
    assert world.client("viewer").post(url, {"idempotency_key": "r1"}).status_code == 403
    response = world.client("operator").post(url, {"idempotency_key": "r1"})
    assert response.status_code == 302
    event.refresh_from_db()
    assert event.status != "parked" and event.attempts <= 1
    assert ActivityLog.objects.filter(action="connector.event.replay").exists()


def test_another_companys_connector_objects_are_404(world):
    other = CompanyFactory(name="Other")
    instance = make_instance(other, name="Theirs")
    link = make_link(instance, IssueFactory(company=other))
    event = make_event(instance, "parked", 5)
    conflict = make_conflict(link)
    client = world.client("owner")
    for url in (reverse("connectors_console:instance-detail", args=[instance.pk]),
                reverse("connectors_console:instance-live", args=[instance.pk])):
        assert client.get(url).status_code == 404
    for url, data in ((reverse("connectors_console:instance-pause", args=[instance.pk]), {}),
                      (reverse("connectors_console:event-replay", args=[event.pk]), {}),
                      (reverse("connectors_console:link-action", args=[link.pk, "unlink"]), {}),
                      (reverse("connectors_console:conflict-resolve", args=[conflict.pk]),
                       {"action": "dismiss", "confirmed": "1"})):
        assert client.post(url, data).status_code == 404
    instance.refresh_from_db(), link.refresh_from_db(), conflict.refresh_from_db(), event.refresh_from_db()
    assert (instance.status, link.status, conflict.status, event.status) == ("active", "healthy", "open", "parked")
    assert "Theirs" not in text(client.get(reverse("connectors_console:instance-list")))


def test_a_viewer_cannot_perform_any_connector_action(world):
    event = make_event(world.instance, "parked", 1)
    conflict = make_conflict(world.link)
    client = world.client("viewer")
    posts = [(reverse("connectors_console:instance-pause", args=[world.instance.pk]), {}),
             (reverse("connectors_console:instance-resume", args=[world.instance.pk]), {}),
             (reverse("connectors_console:event-replay", args=[event.pk]), {}),
             *[(reverse("connectors_console:link-action", args=[world.link.pk, a]), {})
               for a in ("resync", "pause", "resume", "unlink")],
             (reverse("connectors_console:conflict-resolve", args=[conflict.pk]),
              {"action": "dismiss", "confirmed": "1"})]
    for url, data in posts:
        assert client.post(url, data).status_code == 403, url
    assert not Intervention.objects.exists()
    conflict.refresh_from_db()
    assert conflict.status == "open"


# --- issue page link panel ----------------------------------------------------------------------------


def test_issue_page_shows_the_link_panel(world):
    make_conflict(world.link)
    make_event(world.instance, "failed", 1, task=world.link.external_task_id)
    page = text(world.client("operator").get(reverse("console:issue-detail", args=[world.issue.identifier])))
    assert 'id="link-panel"' in page
    assert "demo/app#1" in page and world.link.external_url in page
    assert "Import Only · Paperclip Controlled" in page
    assert "title: external" in page  # field ownership
    assert "label rule #7 → Linus" in page  # the routing rule that chose the assignee
    assert "1 open conflict" in page and f"?linkId={world.link.pk}" in page
    assert "1 retrying" in page
    for action in ("resync", "pause", "unlink"):
        assert reverse("connectors_console:link-action", args=[world.link.pk, action]) in page
    viewer_page = text(world.client("viewer").get(reverse("console:issue-detail", args=[world.issue.identifier])))
    assert 'id="link-panel"' in viewer_page and "Resync now" not in viewer_page


def test_issue_without_link_has_no_panel(world):
    issue = IssueFactory(company=world.company)
    page = text(world.client("owner").get(reverse("console:issue-detail", args=[issue.identifier])))
    assert 'id="link-panel"' not in page


def test_link_pause_resume_and_unlink_from_the_issue_page(world):
    client = world.client("operator")
    issue_url = reverse("console:issue-detail", args=[world.issue.identifier])
    response = client.post(reverse("connectors_console:link-action", args=[world.link.pk, "pause"]),
                           {"idempotency_key": "p1", "next": issue_url})
    assert response.status_code == 302 and response["Location"] == issue_url
    world.link.refresh_from_db()
    assert world.link.status == "paused"
    client.post(reverse("connectors_console:link-action", args=[world.link.pk, "resume"]), {"idempotency_key": "p2"})
    world.link.refresh_from_db()
    assert world.link.status == "healthy"
    client.post(reverse("connectors_console:link-action", args=[world.link.pk, "unlink"]), {"idempotency_key": "p3"})
    world.link.refresh_from_db()
    assert world.link.status == "unlinked"
    assert world.issue.__class__.objects.filter(pk=world.issue.pk).exists()
    assert ActivityLog.objects.filter(action="connector.link.unlink", actor_user=world.users["operator"]).exists()
    assert client.post(reverse("connectors_console:link-action", args=[world.link.pk, "explode"])).status_code == 404


# --- conflict queue --------------------------------------------------------------------------------


def test_conflict_queue_filters_and_shows_three_values_with_an_escaped_diff(world):
    conflict = make_conflict(world.link, external="Fix the <b>login</b> page")
    other_link = make_link(world.instance, IssueFactory(company=world.company), n=2)
    deletion = Conflict.objects.create(company=world.company, instance=world.instance, link=other_link,
                                       kind="deletion", detail="The external task was deleted.")
    client = world.client("viewer")
    url = reverse("connectors_console:conflict-list")
    page = text(client.get(url))
    assert f'id="conflict-{conflict.pk}"' in page and f'id="conflict-{deletion.pk}"' in page
    assert "Fix the &lt;b&gt;login&lt;/b&gt; page" in page and "<b>login</b>" not in page
    assert "<del>sign-in</del>" in page and "<ins>&lt;b&gt;login&lt;/b&gt;</ins>" in page
    assert "octocat" in page and "Linus" in page
    assert "Keep Paperclip" not in page  # viewer
    fragment = client.get(url, {"kind": "deletion"}, **FILTER)
    body = text(fragment)
    assert "<html" not in body and f'id="conflict-{deletion.pk}"' in body and f'conflict-{conflict.pk}"' not in body
    assert "conflict-" not in text(client.get(url, {"status": "resolved"}, **FILTER)).replace("conflict-status", "")
    assert f'id="conflict-{conflict.pk}"' in text(client.get(url, {"instance": str(world.instance.pk)}))
    # Other htmx requests (the page an action redirects to) get the whole page to select from.
    whole = text(client.get(url, **HTMX))
    assert 'id="conflict-results"' in whole and 'id="messages"' in whole
    bad = client.get(url, {"kind": "nonsense"})
    assert bad.status_code == 200 and "Select a valid choice" in text(bad)


def test_conflict_queue_query_count_is_constant(world):
    client = world.client("operator")
    url = reverse("connectors_console:conflict-list")
    make_conflict(world.link)
    client.get(url)
    with CaptureQueriesContext(connection) as few:
        client.get(url)
    for n in range(10):
        make_conflict(make_link(world.instance, IssueFactory(company=world.company), n=n + 20))
    with CaptureQueriesContext(connection) as many:
        client.get(url)
    assert len(many) == len(few)


def test_resolve_asks_for_confirmation_then_calls_the_service(world):
    conflict = make_conflict(world.link)
    world.link.status = "conflict"
    world.link.save(update_fields=["status"])
    client = world.client("operator")
    url = reverse("connectors_console:conflict-resolve", args=[conflict.pk])
    confirm = client.post(url, {"action": "dismiss", "idempotency_key": "c1"})
    assert confirm.status_code == 200 and "Confirm: Dismiss" in text(confirm)
    conflict.refresh_from_db()
    assert conflict.status == "open"  # nothing happened yet
    done = client.post(url, {"action": "dismiss", "confirmed": "1", "idempotency_key": "c1",
                             "expected_status": "open"})
    assert done.status_code == 302
    conflict.refresh_from_db()
    assert conflict.status == "dismissed" and conflict.resolution == "dismiss"
    assert conflict.resolved_by_user == world.users["operator"]
    assert ActivityLog.objects.filter(action="connector.conflict_resolved",
                                      actor_user=world.users["operator"]).exists()
    world.link.refresh_from_db()
    assert world.link.status == "healthy"


def test_a_conflict_resolved_meanwhile_answers_clearly_and_changes_nothing(world):
    conflict = make_conflict(world.link)
    url = reverse("connectors_console:conflict-resolve", args=[conflict.pk])
    world.client("owner").post(url, {"action": "dismiss", "confirmed": "1", "idempotency_key": "first"})
    conflict.refresh_from_db()
    assert conflict.status == "dismissed"
    response = world.client("operator").post(url, {"action": "keep_external", "confirmed": "1",
                                                    "idempotency_key": "second"}, follow=True)
    page = text(response)
    assert "already dismissed" in page and world.users["owner"].username in page
    conflict.refresh_from_db()
    assert conflict.resolution == "dismiss"
    world.issue.refresh_from_db()
    assert world.issue.title == "Fix the sign-in page"


def test_merge_manual_writes_the_edited_value(world):
    conflict = make_conflict(world.link)
    url = reverse("connectors_console:conflict-resolve", args=[conflict.pk])
    client = world.client("operator")
    confirm = client.post(url, {"action": "merge_manual", "merged_value": "Fix the login & sign-in page",
                                "idempotency_key": "m1"})
    assert "Fix the login &amp; sign-in page" in text(confirm)
    client.post(url, {"action": "merge_manual", "merged_value": "Fix the login & sign-in page", "confirmed": "1",
                      "idempotency_key": "m1"})
    conflict.refresh_from_db()
    assert conflict.status == "resolved" and conflict.resolution == "merge_manual"
    world.issue.refresh_from_db()
    assert world.issue.title == "Fix the login & sign-in page"
    # A blank merge is refused by the service with a readable message.
    other = make_conflict(make_link(world.instance, IssueFactory(company=world.company), n=3))
    page = text(client.post(reverse("connectors_console:conflict-resolve", args=[other.pk]),
                            {"action": "merge_manual", "merged_value": "  ", "confirmed": "1"}, follow=True))
    assert "mergedValue" in page
    other.refresh_from_db()
    assert other.status == "open"


# --- dashboard ---------------------------------------------------------------------------------------


def test_dashboard_panel_shows_connector_health_and_open_conflicts(world):
    make_conflict(world.link)
    page = text(world.client("viewer").get(reverse("console:dashboard")))
    assert 'id="connectors-panel"' in page and "GitHub demo" in page
    assert "1 open conflict" in page


def test_dashboard_without_connectors_has_no_panel(db):
    company = CompanyFactory()
    user = MembershipFactory(company=company, role="owner").user
    client = Client()
    client.force_login(user)
    assert 'id="connectors-panel"' not in text(client.get(reverse("console:dashboard")))


# --- connector_export / connector_import ------------------------------------------------------------


def _export(instance) -> dict:
    import json
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("connector_export", str(instance.pk), stdout=out)
    return json.loads(out.getvalue())


def test_export_carries_references_only_and_import_round_trips_idempotently(db, tmp_path):
    import json
    from io import StringIO

    from django.core.management import call_command

    from connectors.models import RoutingRule

    source = CompanyFactory(issue_prefix="SRC")
    linus = AgentFactory(company=source, name="Linus")
    instance = instance_create(actor=SYSTEM, company=source, name="GitHub", provider_key="github_issues",
                               credentials={"value": "ghp_super_secret_value"}, webhook_secret="env:PAPERCLIP_SECRET_GH_HOOK",
                               containers=["demo/app"], triage_agent_id=linus.pk,
                               state_mapping={"open": "active", "closed": "terminal"},
                               routing_aliases={"eng": str(linus.pk)},
                               routing_rules=[{"kind": "label", "match": {"label": "backend"},
                                               "agentId": str(linus.pk)},
                                              {"kind": "default_route", "routingAlias": "eng"}])
    document = _export(instance)
    text_doc = json.dumps(document)
    assert "ghp_super_secret_value" not in text_doc
    assert document["connector"]["credentials"].startswith("secret:")
    assert document["connector"]["webhookSecret"] == "env:PAPERCLIP_SECRET_GH_HOOK"
    assert document["connector"]["triageAgent"] == "Linus"
    assert document["connector"]["routingRules"][0] == {"order": 0, "kind": "label", "match": {"label": "backend"},
                                                        "agent": "Linus", "routingAlias": "", "enabled": True}

    target = CompanyFactory(issue_prefix="DST")
    AgentFactory(company=target, name="linus")  # names match case-insensitively
    document["connector"]["credentials"] = "env:PAPERCLIP_SECRET_GH_TOKEN"  # a stored secret of SRC means nothing in DST
    path = tmp_path / "github.json"
    path.write_text(json.dumps(document))
    out = StringIO()
    call_command("connector_import", str(path), "--company", "DST", "--json", stdout=out)
    first = json.loads(out.getvalue())
    assert first["outcome"] == "created"
    created = ConnectorInstance.objects.get(pk=first["id"])
    assert created.company == target and created.credentials_ref == "env:PAPERCLIP_SECRET_GH_TOKEN"
    assert created.triage_agent.name == "linus"
    assert RoutingRule.objects.filter(instance=created).count() == 2
    out = StringIO()
    call_command("connector_import", str(path), "--company", "DST", "--json", stdout=out)
    assert json.loads(out.getvalue()) == {**first, "outcome": "unchanged"}
    assert ConnectorInstance.objects.filter(company=target).count() == 1

    document["connector"]["pollIntervalSeconds"] = 60
    document["connector"]["routingRules"] = document["connector"]["routingRules"][:1]
    path.write_text(json.dumps(document))
    out = StringIO()
    call_command("connector_import", str(path), "--company", "DST", "--json", stdout=out)
    assert json.loads(out.getvalue())["outcome"] == "updated"
    created.refresh_from_db()
    assert created.poll_interval_seconds == 60 and RoutingRule.objects.filter(instance=created).count() == 1


def test_import_and_export_errors_are_clear_with_nonzero_exit(db, tmp_path):
    import json

    from django.core.management import CommandError, call_command

    CompanyFactory(issue_prefix="DST")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{nope")
    cases = [
        ((str(tmp_path / "missing.json"), "--company", "DST"), "Cannot read"),
        ((str(bad_json), "--company", "DST"), "not valid JSON"),
        ((str(bad_json), "--company", "NOPE"), "not valid JSON"),
    ]
    for args, message in cases:
        with pytest.raises(CommandError, match=message):
            call_command("connector_import", *args)
    for document, message in [
        ({"connector": {}}, "Not a connector export"),
        ({"format": "paperclip.connector/1", "connector": {"name": "X", "provider": "github_issues",
                                                           "token": "abc"}}, "Unknown keys: token"),
        ({"format": "paperclip.connector/1", "connector": {"name": "X", "provider": "github_issues",
                                                           "credentials": "ghp_inline"}}, "reference"),
        ({"format": "paperclip.connector/1", "connector": {"name": "X", "provider": "github_issues",
                                                           "triageAgent": "Nobody"}}, "Nobody"),
        ({"format": "paperclip.connector/1", "connector": {"name": "X", "provider": "nope"}}, "Unknown provider"),
    ]:
        path = tmp_path / "doc.json"
        path.write_text(json.dumps(document))
        with pytest.raises(CommandError, match=message):
            call_command("connector_import", str(path), "--company", "DST")
    assert not ConnectorInstance.objects.exists()
    with pytest.raises(CommandError, match="No connector instance"):
        call_command("connector_export", "not-a-uuid")
    with pytest.raises(CommandError, match="Give an instance id"):
        call_command("connector_export")


# --- the offline demo --------------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_seed_demo_is_idempotent_and_builds_the_connector_demo(db, tmp_path):
    import subprocess
    from io import StringIO

    from django.core.management import call_command

    from cases.models import Case
    from connectors.models import RoutingRule
    from issues.models import Company, Project

    for _ in range(2):
        call_command("seed_demo", "--repo-dir", str(tmp_path / "repo"), "--sandbox-url", "http://127.0.0.1:9",
                     stdout=StringIO())
    company = Company.objects.get(issue_prefix="DEMO")
    project = Project.objects.get(company=company, name="App")
    assert project.repository == str((tmp_path / "repo").resolve())
    log = subprocess.run(["git", "-C", project.repository, "log", "--oneline"], capture_output=True, text=True)
    assert log.returncode == 0 and "Initial commit" in log.stdout
    case = Case.objects.get(company=company, title="Checkout fails on Safari")
    assert case.current_workflow.name == "Bug triage"
    instance = ConnectorInstance.objects.get(company=company)
    assert (instance.credentials_ref, instance.webhook_secret_ref) == ("env:PAPERCLIP_SECRET_GITHUB_SANDBOX_TOKEN",
                                                                       "env:PAPERCLIP_SECRET_GITHUB_SANDBOX_WEBHOOK_SECRET")
    assert instance.base_url == "http://127.0.0.1:9" and instance.containers == ["demo/app"]
    assert not instance.config  # nothing secret (nor anything else) inline
    rule = RoutingRule.objects.get(instance=instance)
    assert (rule.kind, rule.target_agent.name) == ("default_route", "Linus")
    assert Conflict.objects.filter(instance=instance, status="open").count() == 1
    assert TaskLink.objects.filter(instance=instance).count() == 1


@pytest.mark.django_db(transaction=True)
def test_demo_sandbox_delivers_an_issue_that_is_imported_and_routed_to_the_example_agent(
        live_server, settings, tmp_path, monkeypatch):
    """seed_demo + the demo sandbox process (its command, in this process) + the real webhook endpoint
    on a live server: the signed issues.opened delivery is verified, imported and routed."""
    from io import StringIO

    from django.core.management import call_command

    from issues.models import HeartbeatRun, Issue

    settings.CONNECTORS = {**settings.CONNECTORS, "PUBLIC_BASE_URL": live_server.url}
    monkeypatch.setenv("PAPERCLIP_SECRET_GITHUB_SANDBOX_TOKEN", "demo-token-for-tests")
    monkeypatch.setenv("PAPERCLIP_SECRET_GITHUB_SANDBOX_WEBHOOK_SECRET", "demo-secret-for-tests")
    port = _free_port()
    call_command("seed_demo", "--repo-dir", str(tmp_path / "repo"), "--sandbox-url", f"http://127.0.0.1:{port}",
                 stdout=StringIO())
    out = StringIO()
    call_command("demo_sandbox", "--once", "--port", str(port), "--server-url", live_server.url, "--sweep", "0",
                 "--wait", "20", stdout=out)
    assert "webhook answered 202" in out.getvalue()
    from connectors.management.commands.seed_demo import CONFLICT_TASK

    issue = Issue.objects.get(title="Fix the broken link in the README")
    link = TaskLink.objects.get(issue=issue)
    assert link.external_key == "demo/app#2" and link.status == "healthy"
    assert issue.assignee_agent.name == "Linus" and issue.status == "todo"
    assert link.routing["kind"] == "default_route"
    assert HeartbeatRun.objects.filter(agent=issue.assignee_agent, issue=issue).exists()  # Linus is woken
    instance = link.instance
    assert instance.webhook_verified or InboundEvent.objects.filter(instance=instance, verified=True).exists()
    assert Conflict.objects.get(instance=instance, status="open").external_value == CONFLICT_TASK["external"]


def test_demo_sandbox_refuses_to_start_without_its_secrets(db, monkeypatch):
    from django.core.management import CommandError, call_command

    monkeypatch.delenv("PAPERCLIP_SECRET_GITHUB_SANDBOX_TOKEN", raising=False)
    with pytest.raises(CommandError, match="PAPERCLIP_SECRET_GITHUB_SANDBOX_TOKEN"):
        call_command("demo_sandbox", "--once")


def test_make_run_demo_walk_end_to_end(tmp_path):
    """What `make run` starts — migrate, seed_demo, the server, the worker and the demo sandbox — as
    real processes on free ports with a throwaway SQLite database (the embedded default): the
    sandbox's issue is imported, worked by the example agent, and its milestones (the claim, review
    requested) are projected back to the sandbox tracker, its comments are not (§10.2)."""
    import json
    import os
    import secrets
    import subprocess
    import sys
    import time
    import urllib.request
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    web, sandbox_port = _free_port(), _free_port()
    token = secrets.token_urlsafe(16)
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
           "PAPERCLIP_PUBLIC_URL": f"http://127.0.0.1:{web}", "PAPERCLIP_API_URL": f"http://127.0.0.1:{web}/api",
           "PAPERCLIP_DEMO_GITHUB_URL": f"http://127.0.0.1:{sandbox_port}",
           "PAPERCLIP_DEMO_GITHUB_PORT": str(sandbox_port), "PAPERCLIP_DEMO_REPO": str(tmp_path / "repo"),
           "PAPERCLIP_WORKSPACE_ROOT": str(tmp_path / "workspaces"), "PAPERCLIP_SECRET_GITHUB_SANDBOX_TOKEN": token,
           "PAPERCLIP_SECRET_GITHUB_SANDBOX_WEBHOOK_SECRET": secrets.token_urlsafe(16)}
    for key in ("CELERY_BROKER_URL", "DJANGO_ALLOW_ASYNC_UNSAFE"):
        env.pop(key, None)
    manage = [sys.executable, str(root / "manage.py")]
    for args in (["migrate", "--noinput", "-v0"], ["seed_demo"]):
        subprocess.run(manage + args, env=env, cwd=root, check=True, capture_output=True, timeout=120)
    logs = {name: open(tmp_path / f"{name}.log", "w") for name in ("server", "worker", "sandbox")}
    procs = [subprocess.Popen(manage + args, env=env, cwd=root, stdout=logs[name], stderr=subprocess.STDOUT)
             for name, args in (("server", ["runserver", f"127.0.0.1:{web}", "--noreload"]),
                                ("worker", ["paperclip_worker", "--poll", "0.5"]),
                                ("sandbox", ["demo_sandbox", "--sweep", "5"]))]

    def sandbox_get(path):
        request = urllib.request.Request(f"http://127.0.0.1:{sandbox_port}{path}",
                                         headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())

    try:
        deadline, bodies = time.monotonic() + 120, []
        while time.monotonic() < deadline:
            try:
                bodies = [c["body"] for c in sandbox_get("/repos/demo/app/issues/2/comments")]
            except OSError:
                bodies = []
            try:
                labels = [label["name"] for label in sandbox_get("/repos/demo/app/issues/2")["labels"]]
            except OSError:
                labels = []
            if any("Ready for review" in body for body in bodies) and "in review" in labels:
                break
            time.sleep(1)
        logs_text = "\n".join(f"--- {n}\n{(tmp_path / f'{n}.log').read_text()[-3000:]}" for n in logs)
        assert any("Tracked in Paperclip" in body for body in bodies), logs_text  # the backlink
        assert any("picked this up" in body for body in bodies), logs_text  # the claim milestone
        assert any("Ready for review" in body for body in bodies), logs_text  # and the review one
        assert not any("Example agent:" in body for body in bodies)  # its comment stays in Paperclip
        # checkout -> comment -> in_review, and the review state projected back as the tracker's label
        assert "in review" in labels, (labels, logs_text)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for handle in logs.values():
            handle.close()


@pytest.mark.django_db(transaction=True)
def test_two_operators_resolving_the_same_conflict_at_once_act_once():
    """Two operators confirm different resolutions at the same moment (real threads, their own DB
    connections): exactly one resolution is applied; the other operator is told it was resolved
    meanwhile."""
    import threading

    from django.db import connections

    world = World()
    second = MembershipFactory(company=world.company, role="operator").user
    conflict = make_conflict(world.link)
    url = reverse("connectors_console:conflict-resolve", args=[conflict.pk])
    clients = [world.client("operator"), Client()]
    clients[1].force_login(second)
    barrier, pages = threading.Barrier(2), [None, None]

    def resolve(i, action):
        try:
            barrier.wait(timeout=10)
            response = clients[i].post(url, {"action": action, "confirmed": "1", "idempotency_key": f"race-{i}"},
                                       follow=True)
            pages[i] = response.content.decode()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=resolve, args=(0, "keep_external")),
               threading.Thread(target=resolve, args=(1, "dismiss"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "an operator's request hung"
    conflict.refresh_from_db()
    assert conflict.status in ("resolved", "dismissed")
    winner = 0 if conflict.resolution == "keep_external" else 1
    assert "done." in pages[winner]
    assert "already" in pages[1 - winner] and "meanwhile" in pages[1 - winner]
    assert ActivityLog.objects.filter(action="connector.conflict_resolved").count() == 1
