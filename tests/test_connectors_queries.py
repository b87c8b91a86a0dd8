"""Queries per applied event stay bounded (<= 17) and do not grow with the number of links."""
import itertools
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from connectors.models import InboundEvent, TaskLink
from connectors.services import inbound
from issues import selectors
from issues.models import Company, HeartbeatRun, Issue, WakeupRequest
from issues.services.wakeups import wakeups_fold
from tests.connector_factories import make_instance
from tests.connector_fakes import FakeStore, FakeTrackerAdapter
from tests.factories import AgentFactory, CompanyFactory

# Measured over runs of 10 events (a run shares one claim, one INSERT of its audit rows and one update
# of its events' rows): on SQLite a comment is 11.7 (its wake coalesces into the run: fold, primary,
# run), an edit 3.7 (the link's issue is updated without a second read).
MAX_QUERIES = 12
# On PostgreSQL a comment's wake joins the live run in one insert-only statement, folded into the run
# when it starts, and its record is read with the link (measured 5.7).
MAX_PG_COMMENT_QUERIES = 6
# An import also creates its issue (numbering, audit) and the issue's first run; the run needs no
# look-up or race check, since nothing outside the transaction can see a new issue, and the assignee
# routing read is not read again. It is a run of its own (it holds the company's issue counter):
# measured 14.0.
MAX_IMPORT_QUERIES = 14


def _bulk_links(instance, store, count):
    company = Company.objects.get(pk=instance.company_id)
    start = company.issue_counter
    issues = [Issue(company=company, number=start + n, identifier=f"{company.issue_prefix}-{start + n}",
                    title=f"bulk {n}") for n in range(1, count + 1)]
    Issue.objects.bulk_create(issues, batch_size=2000)
    Company.objects.filter(pk=company.pk).update(issue_counter=start + count)
    TaskLink.objects.bulk_create([
        TaskLink(company=company, instance=instance, provider_key=instance.provider_key, issue=issue,
                 external_task_id=f"bulk-{n}", external_key=f"x#{n}", status="healthy")
        for n, issue in enumerate(issues)], batch_size=2000)


def _adapter(instance, store):
    return FakeTrackerAdapter(type("Config", (), {"state_mapping": instance.state_mapping,
                                                  "base_url": store.base_url, "service_account_id": "paperclip-bot",
                                                  "containers": (store.container,)})())


def _queue(instance, store, raw, key, comment=None):
    from connectors.providers.base import EventKind, VerifiedEvent

    adapter = _adapter(instance, store)
    event = VerifiedEvent(event_id=key, kind=EventKind.COMMENT_UPSERTED if comment else EventKind.TASK_UPSERTED,
                          action="x", external_task_id=raw["id"], task=adapter.normalize(raw),
                          comment=adapter.comment(comment) if comment else None)
    inbound.event_store(instance=instance, event=event)


CONTROL = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK")


def _measure(instance, raw_id, expected=1):
    """Statements per applied event, transaction control (BEGIN/COMMIT/SAVEPOINT) not counted."""
    with CaptureQueriesContext(connection) as ctx:
        counts = inbound.task_events_process(instance_id=instance.pk, external_task_id=raw_id)
    assert counts["applied"] == expected, counts
    statements = [q for q in ctx.captured_queries if not q["sql"].upper().startswith(CONTROL)]
    return len(statements) / expected


def _measure_instance(company, agent, links, name):
    instance, store = make_instance(company, name=name, store=FakeStore(container=f"acme/{name.replace(' ', '-')}"),
                                    rules=[{"kind": "default_route", "agentId": agent.pk}])
    _bulk_links(instance, store, links)
    raws = [store.add_task(n, state="doing", labels=["x"]) for n in range(1, 11)]
    imports = []
    for raw in raws:
        _queue(instance, store, raw, f"import-{raw['id']}")
        imports.append(_measure(instance, raw["id"]))
    raw = raws[0]
    for n in range(10):
        store.update(raw["id"], title=f"edited title {n}", body=f"edited body {n}")
        _queue(instance, store, raw, f"edit-{n}")
    edited = _measure(instance, raw["id"], expected=10)
    for n in range(10):
        comment = store.add_comment(raw["id"], f"comment {n}")
        _queue(instance, store, raw, f"comment-{n}", comment=comment)
    commented = _measure(instance, raw["id"], expected=10)
    assert InboundEvent.objects.filter(instance=instance, status="applied").count() == 30
    return max(imports), edited, commented


@pytest.mark.django_db(transaction=True)
def test_queries_per_applied_event_are_bounded_and_independent_of_link_count():
    """Measured as a worker runs it (outside any test transaction), over batches of 10 events."""
    company = CompanyFactory()
    agent = AgentFactory(company=company, name="worker")
    small = _measure_instance(company, agent, 10, "ten links")
    large = _measure_instance(company, agent, 10_000, "ten thousand links")
    print(f"import/edit/comment statements per event: 10 links {small}, 10,000 links {large}")
    imported, edited, commented = large
    assert edited <= MAX_QUERIES and commented <= MAX_QUERIES
    if connection.vendor == "postgresql":
        assert commented <= MAX_PG_COMMENT_QUERIES
    # An import includes the host's issue creation (numbering, audit, assignment wake).
    assert imported <= MAX_IMPORT_QUERIES
    assert small == large


def _savepoints(ctx) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if q["sql"].upper().startswith("SAVEPOINT")]


@pytest.mark.django_db(transaction=True)
def test_imports_and_comments_wake_their_agent_without_savepoints():
    """The new issue's run and wake join the import's transaction directly: no other transaction can
    see the issue, so there is no insert race to roll back from (two round trips per savepoint saved).
    A comment's wake joins the comment's block the same way. issue_create and comment_create open
    none either: any error rolls the apply back whole, so there is nothing to recover to."""
    company = CompanyFactory()
    agent = AgentFactory(company=company, name="worker")
    instance, store = make_instance(company, name="imports", store=FakeStore(container="acme/imports"),
                                    rules=[{"kind": "default_route", "agentId": agent.pk}])
    raw = store.add_task(1, state="doing", labels=["x"])
    _queue(instance, store, raw, "import-1")
    with CaptureQueriesContext(connection) as ctx:
        assert inbound.task_events_process(instance_id=instance.pk, external_task_id=raw["id"])["applied"] == 1
    assert _savepoints(ctx) == []
    issue = TaskLink.objects.get(instance=instance, external_task_id=raw["id"]).issue
    run = HeartbeatRun.objects.get(issue=issue)
    assert run.agent_id == agent.pk and run.status == "queued"
    assert WakeupRequest.objects.get(issue=issue).run_id == run.pk

    _queue(instance, store, raw, "comment-1", comment=store.add_comment(raw["id"], "one more thing"))
    with CaptureQueriesContext(connection) as ctx:
        assert inbound.task_events_process(instance_id=instance.pk, external_task_id=raw["id"])["applied"] == 1
    assert _savepoints(ctx) == []
    coalesced = WakeupRequest.objects.filter(issue=issue).order_by("created_at").last()
    comment_id = str(issue.comments.get().pk)
    assert coalesced.run_id == run.pk and coalesced.status == "coalesced"
    assert coalesced.comment_ids == [comment_id]
    # On PostgreSQL the comment's wake took the insert-only fast path: readers see the comment in
    # the run's context at once, and the fold (the run's start, the sweep) writes it to the run row.
    assert comment_id in selectors.run_with_pending_wakes(HeartbeatRun.objects.get(pk=run.pk)).context["commentIds"]
    wakeups_fold(run_id=run.pk)
    run.refresh_from_db()
    assert comment_id in run.context["commentIds"]


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's cached generic plans")
def test_the_live_link_read_keeps_its_unique_index_under_a_cached_generic_plan():
    """psycopg prepares a statement after its fifth run, and PostgreSQL may then keep one generic plan
    for it. The live-link read every applied event makes must still find its row through the partial
    unique index (link_one_active_per_external_task), not by filtering every link of the instance:
    the index's predicate (status <> 'unlinked') has to be visible in the statement, not a parameter."""
    from connectors.services import apply_base

    instance, store = make_instance(CompanyFactory())
    _bulk_links(instance, store, 300)
    for with_comment in (False, True):
        numbers = itertools.count(1)
        sql = re.sub("%s", lambda _: f"${next(numbers)}", apply_base._active_link_sql(with_comment))
        args = (["'c-1'"] if with_comment else []) + [f"'{instance.pk}'", "'bulk-7'"]
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE connectors_tasklink")  # (statistics that know the instance's 300 links)
            cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            cursor.execute(f"PREPARE link_read AS {sql}")
            cursor.execute(f"EXPLAIN EXECUTE link_read({', '.join(args)})")
            plan = "\n".join(row[0] for row in cursor.fetchall())
            cursor.execute("DEALLOCATE link_read")
        assert "link_one_active_per_external_task" in plan, plan
