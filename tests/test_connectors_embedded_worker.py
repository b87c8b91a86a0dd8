"""The embedded default (no broker): a webhook request only verifies and stores; the in-process worker
(``manage.py paperclip_worker``, which ``make run`` starts) drains the connector inbox on its loop. With a
broker, stored events are kicked through Celery on commit. (The rest of the suite turns kicks on, see
tests/conftest.py, so its deliveries apply right after their commit.)"""
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from connectors.models import InboundEvent, TaskLink
from connectors.services import kicks
from connectors.services.instances import instance_create
from issues import events
from issues.actors import SYSTEM
from issues.management.commands.paperclip_worker import announce
from tests.connector_factories import make_instance
from tests.connector_helpers import delivery_headers, post_webhook
from tests.factories import MembershipFactory
from tests.github_sandbox import DEFAULT_STATE_MAPPING, SANDBOX_REPO, SANDBOX_TOKEN, SANDBOX_WEBHOOK_SECRET
from tests.github_sandbox import SERVICE_LOGIN

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def embedded(settings):
    """The settings as a fresh install has them: no broker, no explicit kick setting."""
    settings.CONNECTORS = {k: v for k, v in settings.CONNECTORS.items() if k != "KICK_ON_COMMIT"}
    settings.PAPERCLIP = {**settings.PAPERCLIP, "KICK_ON_COMMIT": False}
    assert kicks.enabled() is False
    return settings


def _setting_in_a_fresh_process(**env) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "PAPERCLIP_CONNECTOR_KICK"))}
    code = "import django; django.setup(); from django.conf import settings; print(settings.CONNECTORS['KICK_ON_COMMIT'])"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**clean, "DJANGO_SETTINGS_MODULE": "paperclip.settings", **env})
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_the_kick_setting_follows_the_broker(settings):
    assert _setting_in_a_fresh_process() == "False"  # the embedded default
    assert _setting_in_a_fresh_process(CELERY_BROKER_URL="redis://127.0.0.1:6399/0") == "True"
    settings.CONNECTORS = {k: v for k, v in settings.CONNECTORS.items() if k != "KICK_ON_COMMIT"}
    settings.PAPERCLIP = {**settings.PAPERCLIP, "KICK_ON_COMMIT": True}
    assert kicks.enabled() is True  # without the connector setting, the host's kick setting decides
    settings.CONNECTORS = {**settings.CONNECTORS, "KICK_ON_COMMIT": False}
    assert kicks.enabled() is False


@pytest.mark.django_db(transaction=True)  # real commits: nothing may apply at the request's commit either
def test_the_webhook_request_only_stores_and_the_worker_applies(company, github_sandbox, embedded, monkeypatch):
    sb = github_sandbox
    monkeypatch.setenv("PAPERCLIP_SECRET_EMBEDDED_TOKEN", SANDBOX_TOKEN)
    monkeypatch.setenv("PAPERCLIP_SECRET_EMBEDDED_HOOK", SANDBOX_WEBHOOK_SECRET)
    instance = instance_create(actor=SYSTEM, company=company, name="embedded", provider_key="github_issues",
                               base_url=sb.base_url, containers=[SANDBOX_REPO], state_mapping=DEFAULT_STATE_MAPPING,
                               credentials="env:PAPERCLIP_SECRET_EMBEDDED_TOKEN",
                               webhook_secret="env:PAPERCLIP_SECRET_EMBEDDED_HOOK", service_account_id=SERVICE_LOGIN)
    issue = sb.open_issue("Imported by the worker")
    delivery = sb.deliveries[-1]
    headers = delivery_headers(delivery)
    sb.clear_requests()
    response = APIClient().post(f"/api/connectors/{instance.pk}/webhook", data=delivery.body,
                                content_type="application/json", **headers)
    assert response.status_code == 202 and response.json()["status"] == "pending"
    assert sb.requests == []  # no provider round-trip inside the request (nor at its commit)
    assert not TaskLink.objects.exists()
    assert InboundEvent.objects.get().status == "pending"

    call_command("paperclip_worker", "--once", stdout=StringIO())
    event = InboundEvent.objects.get(source="webhook")
    assert event.status == "applied", event.outcome
    link = TaskLink.objects.get(instance=instance)
    assert link.external_key == f"{SANDBOX_REPO}#{issue['number']}" and link.issue.title == "Imported by the worker"


def test_the_worker_tick_drains_what_requests_stored_and_replays(company, embedded, django_capture_on_commit_callbacks):
    instance, store = make_instance(company)
    owner = APIClient()
    owner.force_login(MembershipFactory(company=company, role="owner").user)
    task = store.add_task(1)
    body, _ = store.delivery("task", task["id"])
    assert post_webhook(APIClient(), instance, body, capture=django_capture_on_commit_callbacks).status_code == 202
    event = InboundEvent.objects.get()
    assert event.status == "pending" and store.calls["get_task"] == 0
    announce(events.worker_ticked, now=timezone.now())  # one loop of the in-process worker
    event.refresh_from_db()
    assert event.status == "applied" and TaskLink.objects.filter(instance=instance).count() == 1
    # an operator's replay only re-queues; the worker applies it
    InboundEvent.objects.filter(pk=event.pk).update(status="parked")
    with django_capture_on_commit_callbacks(execute=True):
        replay = owner.post(f"/api/connector-events/{event.pk}/replay", {"idempotencyKey": "e-1"}, format="json")
    assert replay.json()["status"] == "pending"
    event.refresh_from_db()
    assert event.status == "pending"
    announce(events.worker_ticked, now=timezone.now())
    event.refresh_from_db()
    assert event.status in ("applied", "dropped"), event.outcome


def test_with_kicks_on_the_tick_leaves_the_inbox_to_celery(company, settings):
    instance, store = make_instance(company)
    task = store.add_task(1)
    body, _ = store.delivery("task", task["id"])
    settings.CONNECTORS = {**settings.CONNECTORS, "KICK_ON_COMMIT": False}
    post_webhook(APIClient(), instance, body)
    settings.CONNECTORS = {**settings.CONNECTORS, "KICK_ON_COMMIT": True}
    assert announce(events.worker_ticked, now=timezone.now()) == [None]  # the connectors' receiver did nothing
    assert InboundEvent.objects.get().status == "pending"
