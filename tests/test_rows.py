"""paperclip.core.rows, the hot paths' lean reads and inserts, must build exactly what the ORM builds:
the same values (UUIDs, datetimes, booleans, JSON, foreign keys) on PostgreSQL and on SQLite, deferred
fields left deferred, and inserts that behave as ``save()`` for a new row."""
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from connectors.models import InboundEvent
from issues.models import ActivityLog, Agent, AgentApiKey, Issue
from issues.services.companies import agent_api_key_create
from paperclip.core import rows
from tests.connector_factories import make_instance
from tests.factories import AgentFactory, IssueFactory

pytestmark = pytest.mark.django_db


def field_values(obj, exclude=()):
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields if f.attname not in exclude}


def select(model, alias="t", exclude=()):
    return (f"SELECT {rows.select_list(model, alias, exclude)} FROM {connection.ops.quote_name(model._meta.db_table)} "
            f"{alias} WHERE {alias}.id = %s")


def test_a_loaded_row_equals_the_orm_instance(company):
    agent = AgentFactory(company=company)
    issue = IssueFactory(company=company, assignee_agent=agent, status="in_progress", started_at=timezone.now(),
                         description="ünïcode")
    orm = Issue.objects.get(pk=issue.pk)
    loaded, extras = rows.fetch_one(Issue, select(Issue), [rows.pk_value(Issue, issue.pk)])
    assert extras == ()
    assert field_values(loaded) == field_values(orm)
    assert loaded.assignee_agent_id == agent.pk  # a foreign key converts as its target (a UUID on SQLite too)
    assert not loaded._state.adding and loaded._state.db == "default"
    loaded.title = "saved through the instance"  # a loaded instance saves as an ORM one does
    loaded.save(update_fields=["title"])
    assert Issue.objects.get(pk=issue.pk).title == "saved through the instance"


def test_a_missing_row_is_none():
    assert rows.fetch_one(Issue, select(Issue), [rows.pk_value(Issue, uuid.uuid4())]) == (None, ())


def test_a_joined_row_splits_into_its_models_with_deferred_fields_deferred(company):
    agent = AgentFactory(company=company)
    key, _ = agent_api_key_create(agent=agent, name="k")
    qn = connection.ops.quote_name
    sql = (f"SELECT {rows.select_list(AgentApiKey, 'k', ('key_hash',))}, {rows.select_list(Agent, 'a')} "
           f"FROM {qn(AgentApiKey._meta.db_table)} k JOIN {qn(Agent._meta.db_table)} a ON a.id = k.agent_id "
           f"WHERE k.id = %s")
    loaded_key, loaded_agent = rows.split(rows.fetch_row(sql, [rows.pk_value(AgentApiKey, key.pk)]),
                                          (AgentApiKey, ("key_hash",)), Agent)
    assert field_values(loaded_agent) == field_values(Agent.objects.get(pk=agent.pk))
    assert field_values(loaded_key, ("key_hash",)) == field_values(AgentApiKey.objects.get(pk=key.pk), ("key_hash",))
    assert loaded_key.get_deferred_fields() == {"key_hash"}
    assert loaded_key.key_hash == AgentApiKey.objects.get(pk=key.pk).key_hash  # read on first use, as the ORM does


def test_insert_is_a_save_of_a_new_row(company):
    agent = AgentFactory(company=company)
    before = timezone.now()
    row = rows.insert(ActivityLog(company=company, actor_type="agent", actor_agent=agent, action="x.done",
                                  entity_type="issue", entity_id="e1", details={"n": 1, "nested": ["ä", None]}))
    assert row.pk is not None and not row._state.adding
    assert row.created_at >= before  # auto_now_add filled in, as save() does
    stored = ActivityLog.objects.get(pk=row.pk)
    assert field_values(stored) == field_values(row)
    assert stored.details == {"n": 1, "nested": ["ä", None]}


def test_insert_refuses_an_unsaved_related_object_as_save_does(company):
    unsaved = User(username="never-saved")  # (an id the database would give)
    with pytest.raises(ValueError, match="unsaved related object"):
        rows.insert(ActivityLog(company=company, actor_type="user", actor_user=unsaved, action="x",
                                entity_type="issue", entity_id="e"))
    assert not ActivityLog.objects.filter(action="x").exists()


def test_insert_skipping_conflicts_keeps_the_first_row(company):
    instance, _ = make_instance(company)

    def event():
        return InboundEvent(instance=instance, company=company, idempotency_key="delivery-1", source="webhook",
                            kind="task.upserted", external_task_id="7", payload={"v": 1})

    first = rows.insert(event(), skip_conflicts=True)
    assert first is not None and first.pk is not None
    assert rows.insert(event(), skip_conflicts=True) is None  # the unique key refused it; nothing raised
    assert list(InboundEvent.objects.values_list("pk", flat=True)) == [first.pk]


def test_insert_many_writes_every_row_and_keeps_a_time_already_set(company):
    earlier = timezone.now() - timedelta(minutes=5)
    made = [ActivityLog(company=company, actor_type="system", action=f"x.{n}", entity_type="issue", entity_id="e",
                        details={"n": n}, created_at=earlier if n == 0 else None) for n in range(3)]
    before = timezone.now()
    rows.insert_many(made)
    stored = list(ActivityLog.objects.filter(action__startswith="x.").order_by("id"))
    assert [(r.action, r.details) for r in stored] == [("x.0", {"n": 0}), ("x.1", {"n": 1}), ("x.2", {"n": 2})]
    assert stored[0].created_at == earlier  # recorded earlier: kept
    assert all(r.created_at >= before for r in stored[1:])  # unset: auto_now_add fills it in, as insert does


def test_update_fields_and_update_many_write_only_the_named_fields(company):
    issues = [IssueFactory(company=company, title=f"t{n}", description="d") for n in range(3)]
    created = {i.pk: i.updated_at for i in issues}
    for n, issue in enumerate(issues):
        issue.title, issue.description = f"new {n}", "not saved"
    rows.update_fields(issues[0], ["title", "updated_at"])
    rows.update_many(issues[1:], ["title", "updated_at"])
    stored = {i.pk: i for i in Issue.objects.filter(pk__in=[i.pk for i in issues])}
    assert [(stored[i.pk].title, stored[i.pk].description) for i in issues] == [(f"new {n}", "d") for n in range(3)]
    # updated_at named: bumped by pre_save, as save() does, and written as bumped
    assert all(stored[i.pk].updated_at == i.updated_at > created[i.pk] for i in issues)
