"""``represent`` reads plain fields directly: its output must be DRF's own, field for field, for
every shape of value the API returns (nulls, labels, run ids, other time zones, naive and string
timestamps, missing attributes, dicts) and for serializers it must not take over."""
import uuid
from types import SimpleNamespace

import pytest
from django.utils import timezone
from rest_framework import serializers

from issues.api import serializers as s
from issues.api.representation import represent
from issues.models import Comment, Issue, Label
from issues.services.checkout import _with_labels
from tests.factories import AgentFactory, IssueFactory, ProjectFactory, RunFactory


def both(serializer_class, instance):
    return represent(serializer_class, instance), serializer_class(instance).data


def assert_same(serializer_class, instance):
    fast, drf = both(serializer_class, instance)
    assert list(fast) == list(drf)  # same keys, same order
    assert fast == dict(drf)


def test_a_fresh_issue_with_its_nulls(company):
    assert_same(s.IssueSerializer, _with_labels(IssueFactory(company=company)))


def test_a_claimed_labelled_issue_in_a_project(company):
    agent = AgentFactory(company=company)
    run = RunFactory(agent=agent)
    issue = IssueFactory(company=company, project=ProjectFactory(company=company), status="in_progress",
                         assignee_agent=agent, checkout_run=run, execution_run=run,
                         execution_locked_at=timezone.now(), started_at=timezone.now())
    issue.labels.add(Label.objects.create(company=company, name="bug", color="#ff0000"))
    issue = Issue.objects.prefetch_related("labels").get(pk=issue.pk)
    fast, drf = both(s.IssueSerializer, issue)
    assert fast == dict(drf)
    assert str(fast["checkoutRunId"]) == str(run.pk) and fast["labels"][0]["name"] == "bug"
    assert fast["startedAt"].endswith("Z")


def test_a_client_run_id_lock(company):
    issue = IssueFactory(company=company, status="in_progress", assignee_agent=AgentFactory(company=company),
                         checkout_client_run_id=uuid.uuid4())
    assert_same(s.IssueSerializer, _with_labels(issue))


def test_another_current_time_zone_is_applied_as_drf_applies_it(company):
    issue = _with_labels(IssueFactory(company=company, started_at=timezone.now()))
    with timezone.override("Asia/Kolkata"):
        fast, drf = both(s.IssueSerializer, issue)
    assert fast == dict(drf) and fast["createdAt"].endswith("+05:30")


def test_naive_and_string_timestamps_and_a_missing_attribute_go_through_drf():
    class Row(serializers.Serializer):
        at = serializers.DateTimeField()
        text = serializers.DateTimeField()
        absent = serializers.CharField(required=False)
        fallback = serializers.CharField(default="x")
        named = serializers.CharField()
        number = serializers.IntegerField()
        method = serializers.CharField()

    row = SimpleNamespace(at=timezone.now().replace(tzinfo=None), text="2026-01-01T00:00:00Z",
                          named=uuid.UUID(int=7), number="42", method=lambda: "called")
    fast, drf = both(Row, row)
    assert fast == dict(drf) and "absent" not in fast and fast["fallback"] == "x"
    assert fast["method"] == "called" and fast["number"] == 42


def test_a_dict_and_a_serializer_with_its_own_to_representation_are_left_to_drf(company):
    class Upper(serializers.Serializer):
        name = serializers.CharField()

        def to_representation(self, instance):
            return {"name": instance.name.upper()}

    assert represent(Upper, SimpleNamespace(name="abc")) == {"name": "ABC"}
    assert represent(s.LabelBriefSerializer, {"id": uuid.UUID(int=1), "name": "n", "color": "c"}) == {
        "id": str(uuid.UUID(int=1)), "name": "n", "color": "c"}


@pytest.mark.parametrize("serializer_class", [s.CommentSerializer])
def test_a_comment(company, serializer_class):
    issue = IssueFactory(company=company)
    comment = Comment.objects.create(company=company, issue=issue, author_type="user", body="hello")
    assert_same(serializer_class, comment)
