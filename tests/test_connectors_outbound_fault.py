"""Fault test (§13.1.1, §13.1.6): real ``manage.py paperclip_worker`` processes (the embedded worker,
no broker) against this test's database and the GitHub sandbox over real HTTP. Outbound writes are
pending during a provider outage; the first worker retries them; the provider comes back but holds
its answer to the first write it applies, and the worker is SIGKILLed right then (the comment is on
the tracker, the outcome is not in the database); the provider goes down again; a second worker
starts, its lease on the dead worker's claim expires, it retries through the outage and, after the
provider recovers, finishes every write exactly once and in order. Nothing in the test process
delivers a write."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from connectors.choices import OutboundKind, OutboundStatus
from connectors.models import ConnectorInstance, OutboundEffect, TaskLink
from connectors.sandbox.github import GitHubSandbox
from connectors.services import outbound
from issues.actors import SYSTEM, Actor
from issues.models import ActivityLog, HeartbeatRun
from issues.services.issues import issue_update
from issues.services.work_products import work_product_create
from tests.factories import AgentFactory, RunFactory
from tests.github_sandbox import SANDBOX_REPO, SANDBOX_TOKEN, SANDBOX_WEBHOOK_SECRET, SERVICE_LOGIN
from tests.test_celery_topology import database_url, wait_for
from tests.test_connectors_outbound_durability import github_instance
from tests.connector_helpers import delivery_headers

BASE_DIR = Path(__file__).resolve().parent.parent
EFFECT_MARKER = re.compile(r"paperclip:effect:(\d+)")


class Workers:
    """``manage.py paperclip_worker`` subprocesses, each in its own session (killed by process group)."""

    def __init__(self, env, tmp_path):
        self.env, self.tmp_path, self.procs, self.logs = env, tmp_path, {}, {}

    def start(self, name):
        self.logs[name] = self.tmp_path / f"worker-{name}.log"
        with open(self.logs[name], "wb") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "manage.py", "paperclip_worker", "--poll", "0.2", "--sweep", "0.2"],
                cwd=BASE_DIR, env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)

    def kill(self, name):
        proc = self.procs[name]
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # as an OOM kill or a lost machine would
        proc.wait(timeout=10)

    def alive(self, name) -> bool:
        return self.procs[name].poll() is None

    def dump(self) -> str:
        return "".join(f"\n--- worker {name} ---\n{log.read_text(errors='replace')[-4000:]}"
                       for name, log in self.logs.items() if log.exists())


@pytest.fixture
def workers(transactional_db, tmp_path, monkeypatch):
    monkeypatch.setenv("PAPERCLIP_SECRET_GH_DURABLE_TOKEN", SANDBOX_TOKEN)
    monkeypatch.setenv("PAPERCLIP_SECRET_GH_DURABLE_HOOK", SANDBOX_WEBHOOK_SECRET)
    env = {k: v for k, v in os.environ.items() if k not in ("CELERY_BROKER_URL", "CELERY_TASK_ALWAYS_EAGER")}
    env.update({
        "DATABASE_URL": database_url(),
        "PAPERCLIP_CONNECTOR_RETRY_BASE_SECONDS": "0.2",
        "PAPERCLIP_CONNECTOR_OUTBOUND_RETRY_MAX_SECONDS": "0.5",
        "PAPERCLIP_CONNECTOR_OUTBOUND_LEASE_SECONDS": "2",
        "PAPERCLIP_WORKSPACE_ROOT": str(tmp_path / "workspaces"),
        "LOG_LEVEL": "INFO",
    })
    pool = Workers(env, tmp_path)
    try:
        yield pool
    finally:
        for name in list(pool.procs):
            pool.kill(name)


def markers(sandbox, number) -> list[str]:
    return [m for c in sandbox.comments_of(number) for m in EFFECT_MARKER.findall(c["body"])]


def test_a_worker_killed_during_an_outage_leaves_writes_a_new_worker_finishes_exactly_once(
        workers, company, monkeypatch):
    coder = AgentFactory(company=company, name="coder")
    with GitHubSandbox(repos=(SANDBOX_REPO,), token=SANDBOX_TOKEN, service_login=SERVICE_LOGIN,
                       webhook_secret=SANDBOX_WEBHOOK_SECRET) as sandbox:
        instance = github_instance(sandbox, company, coder, monkeypatch)
        far = timezone.now() + timedelta(days=365)
        ConnectorInstance.objects.filter(pk=instance.pk).update(last_poll_at=far, last_reconcile_at=far)  # no polls
        number = sandbox.open_issue("Crash on start", "It crashes.", actor="octocat")["number"]
        for delivery in sandbox.deliveries:  # the import (and its backlink) happen before the outage
            headers = delivery_headers(delivery)
            APIClient().post(f"/api/connectors/{instance.pk}/webhook", data=delivery.body,
                             content_type="application/json", **headers)
        link = TaskLink.objects.get(instance=instance)
        assert OutboundEffect.objects.get(link=link, kind=OutboundKind.BACKLINK).status == OutboundStatus.DONE

        # From here on only the worker processes deliver: the test process records writes and watches.
        mp = pytest.MonkeyPatch()
        mp.setattr(outbound, "_kick", lambda effect_id, due: None)
        try:
            sandbox.outage(503)
            run = RunFactory(agent=coder, issue=link.issue)
            work_product_create(actor=Actor(agent=coder, run_header=str(run.pk)), issue=link.issue,
                                kind="pull_request", url="https://github.com/octo-org/octo-repo/pull/12",
                                title="Fix the config loader")  # the "PR opened" milestone comment
            HeartbeatRun.objects.filter(pk=run.pk).update(status="succeeded", finished_at=timezone.now())
            for status in ("in_progress", "in_review", "done"):  # state, state + review comment, done comment
                issue_update(actor=SYSTEM, issue=TaskLink.objects.get(pk=link.pk).issue, changes={"status": status})
        finally:
            mp.undo()
        writes = list(OutboundEffect.objects.filter(link=link).exclude(kind=OutboundKind.BACKLINK).order_by("id"))
        assert [w.kind for w in writes] == ["comment", "state", "state", "comment", "comment"]
        head = writes[0]
        assert {w.attempts for w in writes} == {0}

        workers.start("first")
        wait_for(lambda: OutboundEffect.objects.get(pk=head.pk).attempts >= 3, timeout=60,
                 what="the first worker to retry the head write through the outage", logs=workers.dump)
        assert [OutboundEffect.objects.get(pk=w.pk).attempts for w in writes[1:]] == [0, 0, 0, 0]

        sandbox.recover(stall_writes=60)  # the provider applies the next write but holds its answer
        wait_for(lambda: markers(sandbox, number), timeout=30, what="the head comment to land on the tracker",
                 logs=workers.dump)
        workers.kill("first")  # the comment exists; its outcome was never recorded
        sandbox.outage(503)
        claimed = OutboundEffect.objects.get(pk=head.pk)
        assert claimed.status == OutboundStatus.PENDING and markers(sandbox, number) == [str(head.pk)]

        workers.start("second")
        retried = claimed.attempts
        wait_for(lambda: OutboundEffect.objects.get(pk=head.pk).attempts >= retried + 2, timeout=60,
                 what="the second worker to retry the dead worker's claim through the outage", logs=workers.dump)
        sandbox.recover()
        wait_for(lambda: not OutboundEffect.objects.filter(link=link, status=OutboundStatus.PENDING).exists(),
                 timeout=60, what="every write to be delivered", logs=workers.dump)
        assert workers.alive("second"), workers.dump()

        delivered = list(OutboundEffect.objects.filter(pk__in=[w.pk for w in writes]).order_by("id"))
        assert [w.status for w in delivered] == ["done"] * 5
        comments = [str(w.pk) for w in delivered if w.kind == OutboundKind.COMMENT]
        assert markers(sandbox, number) == comments  # each comment once, in order; the head not reposted
        labels = {lbl["name"] for lbl in sandbox.issue(number)["labels"]}
        assert "in review" in labels and "in progress" not in labels  # the state writes applied in order
        written = list(ActivityLog.objects.filter(action="connector.outbound_written", entity_id=str(link.pk),
                                                  details__effectId__in=[w.pk for w in writes])
                       .order_by("id").values_list("details__effectId", flat=True))
        assert written == [w.pk for w in delivered]  # one outcome per write, recorded in order
