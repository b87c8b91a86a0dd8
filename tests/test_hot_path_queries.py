"""The hot paths' statement lists, asserted so they cannot silently grow: a checkout is its key
lookup and, on PostgreSQL, one statement that claims, writes the audit row and commits on its own
(elsewhere, and for a linked issue, the claim (one UPDATE ... RETURNING, which also answers the
connectors' "is it linked?") and its audit row (one INSERT) in a transaction); a webhook delivery is its instance read and one INSERT (no BEGIN, no savepoint: the insert is
its own transaction, deduped by the idempotency constraint). Kicks leave the request path."""
import re
import threading

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from connectors import tasks
from connectors.choices import LinkStatus
from connectors.models import ConnectorInstance, InboundEvent, OutboundEffect, TaskLink
from connectors.services import kicks
from issues.models import ActivityLog, Label
from tests.connector_factories import make_instance
from tests.connector_helpers import post_webhook
from tests.factories import IssueFactory

CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE SAVEPOINT")


def statements(ctx) -> list[tuple[str, str]]:
    """(verb, first table) of each statement the block ran, transaction control left out."""
    out = []
    for query in ctx.captured_queries:
        sql = query["sql"].strip()
        if sql.upper().startswith(CONTROL):
            continue
        verb = sql.split(None, 1)[0].upper()
        table = re.search(r'(?:FROM|INTO|UPDATE)\s+"?(\w+)"?', sql, re.IGNORECASE)
        out.append((verb, table.group(1) if table else ""))
    return out


def transaction_control(ctx) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if q["sql"].strip().upper().startswith(CONTROL)]


def checkout(client, issue):
    return client.post(f"/api/issues/{issue.pk}/checkout",
                       {"agentId": str(client.agent.pk), "expectedStatuses": ["todo"]}, format="json")


KEY = ("SELECT", "issues_agentapikey")  # the key and its agent, one join
TRANSACTIONAL_CHECKOUT = [
    KEY,
    ("UPDATE", "issues_issue"),  # the claim, RETURNING the row and whether a tracker task is linked
    ("INSERT", "issues_activitylog"),  # the audit row
]
ONE_STATEMENT_CHECKOUT = [
    KEY,
    ("WITH", "issues_issue"),  # the claim of an unlinked issue and its audit row, one statement
]


def expected_checkout():
    return ONE_STATEMENT_CHECKOUT if connection.vendor == "postgresql" else TRANSACTIONAL_CHECKOUT


def test_checkout_statements_are_the_key_lookup_and_the_claim(agent_client, company):
    assert checkout(agent_client, IssueFactory(company=company)).status_code == 200  # throttled writes done
    issue = IssueFactory(company=company)
    with CaptureQueriesContext(connection) as ctx:
        response = checkout(agent_client, issue)
    assert response.status_code == 200, response.content
    assert statements(ctx) == expected_checkout()
    body = response.json()
    assert body["status"] == "in_progress" and body["checkoutRunId"] == str(agent_client.run.pk)
    assert body["labels"] == [] and body["labelIds"] == []
    row = ActivityLog.objects.get(action="issue.checked_out", entity_id=str(issue.pk))
    assert row.run_id == agent_client.run.pk and row.actor_agent_id == agent_client.agent.pk
    assert row.client_run_id is None


def test_checkout_of_a_labelled_issue_reads_its_labels_once(agent_client, company):
    assert checkout(agent_client, IssueFactory(company=company)).status_code == 200
    issue = IssueFactory(company=company)
    bug = Label.objects.create(company=company, name="bug", color="#ff0000")
    issue.labels.add(bug)
    with CaptureQueriesContext(connection) as ctx:
        response = checkout(agent_client, issue)
    assert response.status_code == 200, response.content
    assert statements(ctx) == [*expected_checkout()[:2], ("SELECT", "issues_label"), *expected_checkout()[2:]]
    assert response.json()["labelIds"] == [str(bug.pk)]
    assert [label["name"] for label in response.json()["labels"]] == ["bug"]


@pytest.mark.django_db(transaction=True)
def test_a_checkout_commits_its_claim_and_audit_row_without_a_transaction_of_its_own(agent_client, company):
    """Outside any transaction (as under a server): on PostgreSQL no BEGIN and no COMMIT, yet the
    claim and its audit row are both committed, by the one statement."""
    assert checkout(agent_client, IssueFactory(company=company)).status_code == 200
    issue = IssueFactory(company=company)
    with CaptureQueriesContext(connection) as ctx:
        assert checkout(agent_client, issue).status_code == 200
    control = transaction_control(ctx)
    if connection.vendor == "postgresql":
        assert control == []
    else:  # SQLite: the transactional claim, committed by its own transaction
        assert control and control[0].upper().startswith("BEGIN") and control[-1].upper() == "COMMIT", control
    issue.refresh_from_db()
    assert issue.status == "in_progress" and issue.checkout_run_id == agent_client.run.pk
    assert ActivityLog.objects.filter(action="issue.checked_out", entity_id=str(issue.pk)).count() == 1


def test_a_refused_checkout_writes_no_audit_row(agent_client, make_agent_client, company):
    """The one statement writes its audit row only for a claim it made: a refusal leaves none."""
    other = make_agent_client(company=company)
    issue = IssueFactory(company=company)
    assert checkout(other, issue).status_code == 200  # held by the other agent's live run
    before = ActivityLog.objects.filter(action="issue.checked_out", entity_id=str(issue.pk)).count()
    response = checkout(agent_client, issue)
    assert response.status_code == 409, response.content
    assert ActivityLog.objects.filter(action="issue.checked_out", entity_id=str(issue.pk)).count() == before == 1
    issue.refresh_from_db()
    assert issue.assignee_agent_id == other.agent.pk


def test_a_linked_issue_is_claimed_in_the_transaction_its_outbound_effect_shares(agent_client, company):
    """A claim fact holds (the issue is linked): the one-statement claim leaves it, and the claim,
    its audit row and the connector's outbound effect commit together, once each."""
    instance, _ = make_instance(company)
    issue = IssueFactory(company=company)
    TaskLink.objects.create(company=company, instance=instance, provider_key=instance.provider_key, issue=issue,
                            external_task_id="T-1", external_key="T-1", external_title="linked",
                            external_state_name="Todo", external_state_category="backlog", status=LinkStatus.HEALTHY,
                            sync_mode="bidirectional")
    with CaptureQueriesContext(connection) as ctx:
        response = checkout(agent_client, issue)
    assert response.status_code == 200, response.content
    done = statements(ctx)
    assert ("UPDATE", "issues_issue") in done and ("INSERT", "issues_activitylog") in done  # the transactional claim
    assert ActivityLog.objects.filter(action="issue.checked_out", entity_id=str(issue.pk)).count() == 1
    assert OutboundEffect.objects.filter(link__issue=issue).exists()


INTAKE = [
    ("SELECT", "connectors_connectorinstance"),
    ("SELECT", "connectors_connectorsecret"),  # this instance's secret is stored (an env: secret reads nothing)
    ("SELECT", "connectors_routingrule"),  # the container check of its routing rules
    ("INSERT", "connectors_inboundevent"),  # the store: ON CONFLICT DO NOTHING RETURNING id
]


@pytest.fixture
def quiet_instance(company, settings):
    """An instance whose health write (at most one a second) is not due, kicks off (stored only)."""
    settings.CONNECTORS = {**settings.CONNECTORS, "KICK_ON_COMMIT": False}
    instance, store = make_instance(company)
    ConnectorInstance.objects.filter(pk=instance.pk).update(
        last_webhook_at=timezone.now() + timezone.timedelta(minutes=5), webhook_verified=True)
    return instance, store


@pytest.mark.django_db(transaction=True)
def test_webhook_intake_is_one_insert_in_its_own_transaction(quiet_instance):
    instance, store = quiet_instance
    task = store.add_task(1)
    body, delivery = store.delivery("task", task["id"])
    with CaptureQueriesContext(connection) as ctx:
        response = post_webhook(Client(), instance, body)
    assert response.status_code == 202, response.content
    assert statements(ctx) == INTAKE
    assert transaction_control(ctx) == []  # autocommit: the INSERT is the whole transaction
    event = InboundEvent.objects.get()
    assert response.json() == {"eventId": event.pk, "idempotencyKey": event.idempotency_key,
                               "status": "pending", "duplicate": False}

    # A redelivery: the constraint refuses the row, the stored one is read back; still one row.
    with CaptureQueriesContext(connection) as ctx:
        again = post_webhook(Client(), instance, body)
    assert again.status_code == 202 and again.json() == {**response.json(), "duplicate": True}
    assert statements(ctx) == [*INTAKE, ("SELECT", "connectors_inboundevent")]
    assert InboundEvent.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_redeliveries_store_one_row(quiet_instance):
    """Eight clients deliver the same body at once (own connections): one row, one ``duplicate: false``."""
    instance, store = quiet_instance
    body, _ = store.delivery("task", store.add_task(2)["id"])
    barrier = threading.Barrier(8)
    results = [None] * 8

    def deliver(i):
        try:
            barrier.wait(timeout=30)
            results[i] = post_webhook(Client(), instance, body).json()
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert InboundEvent.objects.count() == 1
    assert sorted(r["duplicate"] for r in results) == [False] + [True] * 7
    assert {r["eventId"] for r in results} == {InboundEvent.objects.get().pk}


class Broker:
    """Records what a Kicker publishes (the keys of each message and the thread that sent it); the
    first message can be held, as a slow broker would."""

    def __init__(self, hold_first=False, refuse=()):
        self.messages, self.threads = [], []
        self.started, self.gate = threading.Event(), threading.Event()
        self.hold_first, self.refuse = hold_first, set(refuse)

    def send_many(self, keys):
        self.threads.append(threading.current_thread())
        if self.refuse & set(keys):
            raise ConnectionError("broker down")
        if self.hold_first and not self.messages:
            self.started.set()
            self.gate.wait(timeout=10)
        self.messages.append(list(keys))


def test_kicks_are_sent_off_the_request_thread_and_coalesced(settings):
    """With a broker (not eager) the caller only queues the kick; the kicker's thread sends it, a
    kick queued again before it went out is sent once, and the kicks waiting together share one
    message, in the order they were queued."""
    settings.CELERY_TASK_ALWAYS_EAGER = False
    broker = Broker(hold_first=True)
    kicker = kicks.Kicker(broker.send_many, linger=0)
    kicker.put("first")
    assert broker.started.wait(timeout=10)
    for key in ("task-a", "task-b", "task-a", "task-c"):  # the broker is slow: these wait meanwhile
        kicker.put(key)
    broker.gate.set()
    assert kicker.flush(timeout=10)
    assert broker.messages == [["first"], ["task-a", "task-b", "task-c"]]
    assert threading.current_thread() not in broker.threads


def test_a_message_carries_at_most_a_batch_of_kicks(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    broker = Broker(hold_first=True)
    kicker = kicks.Kicker(broker.send_many, batch=2, linger=0)
    kicker.put("first")
    assert broker.started.wait(timeout=10)
    for key in ("a", "b", "c", "d", "e"):
        kicker.put(key)
    broker.gate.set()
    assert kicker.flush(timeout=10)
    assert broker.messages == [["first"], ["a", "b"], ["c", "d"], ["e"]]


def test_a_kick_after_a_quiet_spell_goes_out_at_once_and_a_burst_lingers(settings):
    """The first kick is not held back by the linger; kicks right behind it wait out the linger and
    share a message (what keeps a busy web process from paying a publish per delivery)."""
    settings.CELERY_TASK_ALWAYS_EAGER = False
    broker = Broker()
    kicker = kicks.Kicker(broker.send_many, linger=2.0)
    kicker.put("first")
    assert kicker.flush(timeout=1.5), "the first kick waited for the linger"
    kicker.put("a")
    kicker.put("b")
    assert not kicker.flush(timeout=0.2)  # lingering, not lost
    assert kicker.flush(timeout=10)
    assert broker.messages == [["first"], ["a", "b"]]


def test_a_kick_the_broker_refuses_is_not_an_error(settings, caplog):
    """A failed send is logged; the sweep applies what it would have started (lost-kick test in
    test_connectors_engine.py)."""
    settings.CELERY_TASK_ALWAYS_EAGER = False
    broker = Broker(refuse={"task-a"})
    kicker = kicks.Kicker(broker.send_many, batch=1, linger=0)
    kicker.put("task-a")
    kicker.put("task-b")
    assert kicker.flush(timeout=10)
    assert broker.messages == [["task-b"]] and "not sent; the sweep will pick them up" in caplog.text


def test_eager_kicks_run_in_the_callers_thread(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    broker = Broker()
    kicks.Kicker(broker.send_many).put("task-a")
    assert broker.messages == [["task-a"]] and broker.threads == [threading.current_thread()]


@pytest.mark.django_db(transaction=True)
def test_dispatcher_kicks_of_a_burst_share_one_message(settings, monkeypatch):
    """Every commit that queues a run kicks the dispatcher; one dispatch pass starts every queued
    run, so the kicks committed while a publish is under way go out as one message, from the
    kicker's thread, not one per commit."""
    from django.db import transaction

    from issues.services import kicks as dispatch_kicks

    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.PAPERCLIP = {**settings.PAPERCLIP, "KICK_ON_COMMIT": True}
    broker = Broker(hold_first=True)  # stands for dispatch_kicks._send_dispatch (one dispatch_runs a message)
    monkeypatch.setattr(dispatch_kicks, "dispatch_kicker", kicks.Kicker(broker.send_many, linger=0))
    with transaction.atomic():
        dispatch_kicks.kick_dispatcher()
        assert not broker.messages  # nothing before the commit
    assert broker.started.wait(timeout=10)
    for _ in range(5):  # commits while the first publish is still under way
        with transaction.atomic():
            dispatch_kicks.kick_dispatcher()
    broker.gate.set()
    assert dispatch_kicks.dispatch_kicker.flush(timeout=10)
    assert broker.messages == [["dispatch"], ["dispatch"]]
    assert threading.current_thread() not in broker.threads


@pytest.mark.django_db(transaction=True)
def test_one_message_applies_each_of_its_tasks_and_one_failure_does_not_hold_the_rest(quiet_instance):
    """``process_task_events_many`` (the message a burst of kicks shares): every task in it is
    applied even when one before it fails, and the failure is still raised (Celery logs it)."""
    instance, store = quiet_instance
    keys = []
    for n in (3, 4):
        task = store.add_task(n)
        body, _ = store.delivery("task", task["id"])
        assert post_webhook(Client(), instance, body).status_code == 202
        keys.append([str(instance.pk), str(task["id"])])
    assert InboundEvent.objects.filter(status="pending").count() == 2
    with pytest.raises(ValidationError):
        tasks.process_task_events_many([keys[0], ["not-a-connector-id", "9"], keys[1]])
    assert sorted(InboundEvent.objects.values_list("external_task_id", "status")) == \
        sorted((key[1], "applied") for key in keys)
