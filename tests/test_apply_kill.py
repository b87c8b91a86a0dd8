"""Exactly-once apply when a worker is SIGKILLed mid-backlog.

A real worker process (``task_events_process``, the code a Celery worker runs) applies a backlog of
signed GitHub deliveries; it is stopped dead (SIGKILL) while one event's writes are done but not
committed. A fresh worker then finishes the backlog: every event is applied exactly once, in its
task's order, and the killed event's writes exist once (nothing half-committed, nothing doubled).
On PostgreSQL, while the doomed worker holds that event, another worker leaves the task alone
(SKIP LOCKED: workers take disjoint tasks)."""
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from django.db import connection

from connectors.models import ExternalCommentLink, InboundEvent, TaskLink
from connectors.services import drain, inbound
from connectors.services.instances import instance_create
from connectors.services.intake import webhook_intake
from issues.actors import SYSTEM
from issues.models import ActivityLog, Comment, Issue
from tests.factories import AgentFactory, CompanyFactory
from tests.test_celery_topology import database_url
from bench.serving import github_signature

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "connectors" / "sandbox" / "fixtures" / "github"
SECRET = "apply-kill-secret"
REPO = "Codertocat/Hello-World"
TASKS = 4
ROUNDS = ("opened", "comment", "edited", "comment")  # per task, stored round-robin across tasks

# The worker: the real apply code; on the Nth event it stops inside that event's transaction (its
# writes made, not committed) and says so, then waits to be killed.
WORKER = r"""
import os, sys
import django
django.setup()
from connectors.services import inbound

hold_at, instance_id, tasks = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
real, seen = inbound.event_apply, [0]

def holding(*, instance, event):
    outcome = real(instance=instance, event=event)
    seen[0] += 1
    if seen[0] == hold_at:
        print(f"HOLD {event.pk}", flush=True)
        sys.stdin.read()  # never returns: the test kills this process here
    return outcome

inbound.event_apply = holding
for task_id in tasks:
    inbound.task_events_process(instance_id=instance_id, external_task_id=task_id)
print("DONE", flush=True)
"""


def _payloads():
    opened = json.loads((FIXTURE / "issues_opened.payload.json").read_text())
    edited = json.loads((FIXTURE / "issues_edited.payload.json").read_text())
    commented = json.loads((FIXTURE / "issue_comment_created.payload.json").read_text())
    for r, what in enumerate(ROUNDS):
        for t in range(1, TASKS + 1):
            stamp = f"2024-01-01T00:{r:02d}:00Z"
            base = edited if what == "edited" else opened
            issue = {**base["issue"], "id": 900 + t, "number": t, "title": f"task {t} {what} {r}",
                     "html_url": f"https://github.com/{REPO}/issues/{t}", "updated_at": stamp,
                     "assignee": None, "assignees": [], "milestone": None, "state": "open"}
            if what == "comment":
                issue["title"] = f"task {t} opened 0"
                comment = {**commented["comment"], "id": 5000 + t * 10 + r, "body": f"comment {r} on {t}",
                           "created_at": stamp, "updated_at": stamp}
                yield "issue_comment", {**commented, "issue": issue, "comment": comment}
            else:
                yield "issues", {**base, "issue": issue}


def _backlog(settings):
    company = CompanyFactory()
    triage = AgentFactory(company=company, name="triage")
    instance = instance_create(
        actor=SYSTEM, company=company, name="kill test", provider_key="github_issues",
        base_url="https://api.github.invalid", containers=[REPO], webhook_secret={"value": SECRET},
        state_mapping={"open": "backlog", "closed": "terminal"}, triage_agent_id=triage.pk)
    settings.CONNECTORS = {**settings.CONNECTORS, "KICK_ON_COMMIT": False}  # stored only: the worker processes apply it
    for event, payload in _payloads():
        body = json.dumps(payload).encode()
        webhook_intake(instance=instance, body=body, headers={
            "x-github-event": event, "x-github-delivery": hashlib.sha1(body).hexdigest(),
            "x-hub-signature-256": github_signature(SECRET, body)})
    assert InboundEvent.objects.filter(instance=instance, status="pending").count() == TASKS * len(ROUNDS)
    tasks = list(dict.fromkeys(InboundEvent.objects.filter(instance=instance).order_by("id")
                               .values_list("external_task_id", flat=True)))
    return instance, tasks


def _read_line(proc, timeout=120) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "the worker said nothing in time"
    return proc.stdout.readline().strip()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("hold_at,kind", [(len(ROUNDS) + 1, "an import"), (len(ROUNDS) + 2, "a comment")])
def test_a_worker_killed_mid_backlog_leaves_every_event_applied_exactly_once(settings, hold_at, kind):
    instance, tasks = _backlog(settings)
    # tasks are worked one after another, each queue in order: the held event is task 2's first or second
    held_kind = "task.upserted" if kind == "an import" else "comment.upserted"
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "paperclip.settings",
           "PYTHONPATH": str(ROOT), "LOG_LEVEL": "ERROR"}
    env.pop("CELERY_BROKER_URL", None)
    proc = subprocess.Popen([sys.executable, "-c", WORKER, str(hold_at), str(instance.pk), *tasks], cwd=ROOT,
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = _read_line(proc)
        assert line.startswith("HOLD "), line
        held = InboundEvent.objects.get(pk=int(line.split()[1]))
        assert held.kind == held_kind and held.external_task_id == tasks[1]
        assert held.status == "pending" and held.attempts == 0  # its writes are not committed
        if connection.vendor == "postgresql":
            # another worker leaves the held task to its holder: nothing applied, nothing waited for
            assert inbound.task_events_process(instance_id=instance.pk, external_task_id=tasks[1]) == {
                "applied": 0, "dropped": 0, "failed": 0, "parked": 0}
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdin.close()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert InboundEvent.objects.filter(instance=instance, status="applied").count() == hold_at - 1

    # a restarted worker drains what is left (drain.inbox_due: the pending queues)
    for instance_id, task_id in drain.inbox_due(instance_id=instance.pk):
        inbound.task_events_process(instance_id=instance_id, external_task_id=task_id)

    events = list(InboundEvent.objects.filter(instance=instance).order_by("id"))
    assert {e.status for e in events} == {"applied"}, [(e.pk, e.status, e.outcome) for e in events]
    assert all(e.attempts == 1 for e in events)  # the killed attempt left no trace: applied once
    by_task = defaultdict(list)
    for e in events:
        by_task[e.external_task_id].append(e.applied_at)
    assert all(stamps == sorted(stamps) and len(set(stamps)) == len(stamps) for stamps in by_task.values())
    links = TaskLink.objects.filter(instance=instance)
    assert links.count() == TASKS and Issue.objects.filter(company_id=instance.company_id).count() == TASKS
    assert ActivityLog.objects.filter(action="connector.task_imported").count() == TASKS
    comments_per_task = ROUNDS.count("comment")
    for link in links:
        t = int(link.external_task_id) - 900
        assert link.issue.title == f"task {t} edited 2"  # the last edit won: order kept
        assert Comment.objects.filter(issue=link.issue, provenance__kind="external_comment").count() \
            == comments_per_task
    assert ExternalCommentLink.objects.filter(instance=instance).count() == TASKS * comments_per_task
