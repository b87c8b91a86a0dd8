"""The connector engine in the production topology: real ``celery worker`` and ``celery beat``
processes against Redis and this test's database apply 1,000 queued webhook deliveries; the
worker is SIGKILLed mid-stream and another one started; afterwards every delivery is applied
exactly once (no loss, no duplicate). Nothing in the test process applies events."""
import json
import uuid
from pathlib import Path

from celery import Celery
from django.db import transaction

from connectors.sandbox.github import DEFAULT_FIXTURES_DIR
from connectors.models import InboundEvent, TaskLink
from connectors.services import inbound, kicks
from connectors.services.instances import instance_create
from connectors.services.intake import webhook_intake
from issues.actors import SYSTEM
from issues.models import ActivityLog, Comment, Issue
from tests.factories import AgentFactory, CompanyFactory
from tests.test_celery_topology import topology, wait_for  # noqa: F401  (fixture import)
from tests.test_connectors_github import signature

FIXTURES = Path(DEFAULT_FIXTURES_DIR)  # the real GitHub payloads, copied unchanged into the package
SECRET = "topology-hook-secret"
TASKS, EDITS = 200, 3  # 200 x (opened + 3 edits + 1 comment) = 1,000 deliveries


def deliveries():
    opened = json.loads((FIXTURES / "issues_opened.payload.json").read_text())
    edited = json.loads((FIXTURES / "issues_edited.payload.json").read_text())
    commented = json.loads((FIXTURES / "issue_comment_created.payload.json").read_text())
    out = []
    for t in range(1, TASKS + 1):
        base = {"id": 40_000_000 + t, "number": t, "html_url": f"https://github.com/Codertocat/Hello-World/issues/{t}"}
        out.append(("issues", {**opened, "issue": {**opened["issue"], **base, "title": f"task {t}",
                                                   "updated_at": "2024-01-01T00:00:00Z"}}))
        for k in range(1, EDITS + 1):
            out.append(("issues", {**edited, "issue": {**edited["issue"], **base, "title": f"task {t} v{k}",
                                                       "updated_at": f"2024-01-01T00:00:0{k}Z"}}))
        out.append(("issue_comment", {**commented, "issue": {**commented["issue"], **base,
                                                             "updated_at": "2024-01-01T00:00:05Z"},
                                       "comment": {**commented["comment"], "id": 60_000_000 + t,
                                                   "body": f"comment on {t}"}}))
    return out


def test_worker_sigkill_mid_stream_applies_every_delivery_exactly_once(topology, monkeypatch, settings):
    topology.env.update({"PAPERCLIP_CONNECTOR_SWEEP_SECONDS": "1", "PAPERCLIP_CONNECTOR_STALE_PENDING_SECONDS": "2",
                         "PAPERCLIP_SECRET_GH_TOPOLOGY_SECRET": SECRET, "PAPERCLIP_CONNECTOR_RETRY_BASE_SECONDS": "0.2"})
    monkeypatch.setenv("PAPERCLIP_SECRET_GH_TOPOLOGY_SECRET", SECRET)
    company = CompanyFactory()
    triage = AgentFactory(company=company, name="triage", status="paused")  # no runs are started by imports
    instance = instance_create(actor=SYSTEM, company=company, name="topology", provider_key="github_issues",
                               base_url="https://api.github.invalid", containers=["Codertocat/Hello-World"],
                               state_mapping={"open": "backlog", "closed": "terminal"},
                               webhook_secret="env:PAPERCLIP_SECRET_GH_TOPOLOGY_SECRET", triage_agent_id=triage.pk)
    # Celery lets a CELERY_BROKER_URL environment variable win over the argument: point it at the
    # test's private Redis database too (CI exports the shared broker's URL).
    monkeypatch.setenv("CELERY_BROKER_URL", topology.env["CELERY_BROKER_URL"])
    broker = Celery(broker=topology.env["CELERY_BROKER_URL"])

    # Kicks go out as production sends them: a Kicker's thread, the kicks waiting together sharing
    # a process_task_events_many message.
    settings.CELERY_TASK_ALWAYS_EAGER = False
    kicker = kicks.Kicker(lambda keys: broker.send_task("connectors.tasks.process_task_events_many",
                                                        args=[[list(key) for key in keys]]))

    def kick_over_redis(instance_id, external_task_id):
        key = (str(instance_id), external_task_id)
        transaction.on_commit(lambda: kicker.put(key))

    monkeypatch.setattr(inbound, "kick", kick_over_redis)
    import connectors.services.intake as intake_module

    monkeypatch.setattr(intake_module, "kick", kick_over_redis)
    # The deliveries are stored (and their kicks queued in Redis) before any worker runs.
    for event, payload in deliveries():
        body = json.dumps(payload).encode()
        webhook_intake(instance=instance, body=body, headers={
            "x-github-event": event, "x-github-delivery": str(uuid.uuid4()), "x-hub-signature-256": signature(SECRET,
                                                                                                              body)})
    assert kicker.flush(timeout=60)
    assert InboundEvent.objects.filter(instance=instance, status="pending").count() == 1000

    def applied():
        return InboundEvent.objects.filter(instance=instance, status__in=("applied", "dropped")).count()

    topology.worker("first")
    topology.wait_ready("first")
    wait_for(lambda: applied() >= 100, timeout=120, what="the first worker to apply events", logs=topology.dump)
    topology.kill("first")  # SIGKILL mid-stream: unacknowledged kicks and open transactions die with it
    at_kill = applied()
    assert at_kill < 1000, "the worker finished before it could be killed; raise TASKS"
    topology.worker("second")
    topology.beat()
    topology.wait_ready("second")
    wait_for(lambda: applied() == 1000, timeout=180, what="every delivery to be applied", logs=topology.dump)

    events = InboundEvent.objects.filter(instance=instance)
    assert events.count() == 1000 and not events.exclude(status="applied").exists(), \
        list(events.exclude(status="applied").values_list("status", "outcome")[:5])
    assert Issue.objects.filter(company=company).count() == TASKS
    assert TaskLink.objects.filter(instance=instance).count() == TASKS
    assert ActivityLog.objects.filter(action="connector.task_imported").count() == TASKS
    comments = Comment.objects.filter(issue__company=company, provenance__kind="external_comment")
    assert comments.count() == TASKS
    assert comments.values("provenance__externalCommentId").distinct().count() == TASKS
    titles = set(Issue.objects.filter(company=company).values_list("title", flat=True))
    assert titles == {f"task {t} v{EDITS}" for t in range(1, TASKS + 1)}  # per-task order kept
