"""The comment backstop (External Task Protocol §7.1.2, §7.1.3, §13.1.3) against the GitHub, Linear and
Jira sandboxes over real HTTP: a comment, a ``/paperclip`` command, an edit or a deletion whose webhook
was lost reaches Paperclip through the poll and reconcile ticks, exactly once, with the per-link
cursors committed with the pages they describe and a bounded number of links read per tick."""
from __future__ import annotations

import pytest

from connectors.models import ConnectorInstance, ExternalCommentLink, InboundEvent, OutboundEffect, SyncCursor, SyncError
from connectors.services import comment_poll, polling
from issues.models import ActivityLog
from tests.factories import AgentFactory
from tests.sandbox_trackers import external_comments, make_tracker, tracker  # noqa: F401  (fixture import)


def poll(tracker):
    with tracker.capture(execute=True):
        return polling.instance_poll(instance_id=tracker.instance.pk)


def reconcile(tracker):
    with tracker.capture(execute=True):
        return polling.instance_reconcile(instance_id=tracker.instance.pk)


def commented_ids(issue) -> list[str]:
    return [c.provenance["externalCommentId"] for c in external_comments(issue)]


# --- missed comments -----------------------------------------------------------------------------------
def test_a_comment_whose_webhook_was_lost_arrives_with_the_next_poll(tracker):
    task_id, link = tracker.link_task()
    comment_id = tracker.comment(task_id, "Still crashing on 1.2, the log is attached.")
    lost = tracker.drop()
    assert lost and not external_comments(link.issue).exists()

    result = poll(tracker)

    assert result["comments"]["links"] == 1 and result["comments"]["comments"] == 1
    [imported] = external_comments(link.issue)
    # the same attributed, untrusted comment a webhook would have made
    assert imported.provenance["externalCommentId"] == comment_id and imported.provenance["untrusted"] is True
    assert "Still crashing on 1.2" in imported.body and "(external, untrusted)" in imported.body
    event = InboundEvent.objects.get(instance=tracker.instance, kind="comment.upserted", source="poll")
    assert (event.status, event.outcome) == ("applied", f"comment imported on {link.issue.identifier}")
    assert SyncCursor.objects.filter(instance=tracker.instance, scope=f"comments:{link.pk}").exclude(cursor="").exists()
    # the lost delivery turns up late after all, and the next poll lists the comment again: one comment
    for delivery in lost:
        assert tracker.post(delivery).status_code == 202
    events = InboundEvent.objects.count()
    poll(tracker)
    assert commented_ids(link.issue) == [comment_id]
    assert InboundEvent.objects.count() == events  # nothing new was even stored by the poll


def test_a_comment_delivered_by_its_webhook_is_not_imported_again_by_the_backstop(tracker):
    task_id, link = tracker.link_task()
    comment_id = tracker.comment(task_id, "**Repro**: run `app --safe`, then open Settings.\n\n- step one\n- two")
    tracker.forward()
    [imported] = external_comments(link.issue)
    body = imported.body

    poll(tracker)
    reconcile(tracker)

    assert commented_ids(link.issue) == [comment_id]
    imported.refresh_from_db()
    # the API's version of the comment is the one the webhook carried: nothing to edit, nothing stored
    assert imported.body == body and "edited" not in imported.provenance
    assert not InboundEvent.objects.filter(instance=tracker.instance, kind="comment.upserted",
                                           source__in=("poll", "reconcile")).exists()


def test_a_lost_paperclip_command_is_executed_once_by_the_backstop(tracker, company):
    AgentFactory(company=company, name="reviewer")
    task_id, link = tracker.link_task()
    comment_id = tracker.comment(task_id, "/paperclip assign reviewer")
    lost = tracker.drop()

    poll(tracker)

    link.issue.refresh_from_db()
    assert link.issue.assignee_agent.name == "reviewer"
    executed = ActivityLog.objects.filter(action="connector.command", details__externalCommentId=comment_id)
    assert [row.details["outcome"] for row in executed] == ["assigned to reviewer"]
    reply = OutboundEffect.objects.get(link=link, source_id=f"command:{comment_id}:0")
    assert reply.status == "done"  # answered on the tracker (§8.2)
    # the late webhook, the next poll and the reconcile tick all see a command already handled
    for delivery in lost:
        tracker.post(delivery)
    poll(tracker)
    reconcile(tracker)
    assert executed.count() == 1
    assert OutboundEffect.objects.filter(link=link, source_id__startswith="command:").count() == 1
    assert not external_comments(link.issue).exists()  # a command is not a thread comment


def test_a_lost_resume_command_still_reaches_a_paused_link(company, monkeypatch, django_capture_on_commit_callbacks):
    with make_tracker("github", company, monkeypatch, django_capture_on_commit_callbacks) as tracker:
        task_id, link = tracker.link_task()
        tracker.comment(task_id, "/paperclip pause")
        tracker.forward()
        link.refresh_from_db()
        assert link.status == "paused"
        said = tracker.comment(task_id, "Said while the link was paused.")
        tracker.comment(task_id, "/paperclip resume")
        tracker.drop()

        poll(tracker)

        link.refresh_from_db()
        assert link.status == "healthy"
        assert commented_ids(link.issue) == [said]  # not imported while paused; the resume's resync brought it


# --- edits and deletions ----------------------------------------------------------------------------------
def test_an_edit_and_a_deletion_whose_webhooks_were_lost_are_repaired(tracker):
    task_id, link = tracker.link_task()
    first = tracker.comment(task_id, "It fails on startup.")
    second = tracker.comment(task_id, "Same here.")
    tracker.forward()
    imported = external_comments(link.issue).get(provenance__externalCommentId=first)

    tracker.edit_comment(first, "It fails on startup and on resume.")
    tracker.drop()
    poll(tracker)
    imported.refresh_from_db()
    assert "on startup and on resume" in imported.body and imported.provenance["edited"] is True
    assert ActivityLog.objects.filter(action="connector.comment_edited", entity_id=link.pk).count() == 1

    tracker.delete_comment(first)
    tracker.drop()
    poll(tracker)  # an incremental listing cannot tell a deleted comment from an unchanged one
    imported.refresh_from_db()
    assert not imported.provenance.get("externalDeleted")

    result = reconcile(tracker)  # the complete listing can

    assert result["comments"]["deleted"] == 1
    imported.refresh_from_db()
    assert imported.provenance["externalDeleted"] is True
    assert ExternalCommentLink.objects.get(instance=tracker.instance, external_comment_id=first).deleted
    # the host comment stays for the record; the other one is untouched
    assert commented_ids(link.issue) == [first, second]
    assert not external_comments(link.issue).get(provenance__externalCommentId=second).provenance.get(
        "externalDeleted")
    assert reconcile(tracker)["comments"]["deleted"] == 0  # recorded once


def test_a_deletion_is_never_concluded_from_a_partial_listing(company, monkeypatch, settings,
                                                              django_capture_on_commit_callbacks):
    settings.CONNECTORS = {**settings.CONNECTORS, "COMMENT_FULL_MAX_PAGES": 2}
    with make_tracker("github", company, monkeypatch, django_capture_on_commit_callbacks) as tracker:
        task_id, link = tracker.link_task()
        ids = [tracker.comment(task_id, f"Note {n}") for n in range(3)]
        tracker.forward()
        tracker.delete_comment(ids[2])
        tracker.drop()
        adapter = tracker.small_pages(1)  # backlink + 2 notes: three pages, more than the bound
        with tracker.capture(execute=True):
            assert comment_poll.comments_reconcile(instance=tracker.instance, adapter=adapter)["deleted"] == 0
        assert not ExternalCommentLink.objects.filter(deleted=True).exists()

        settings.CONNECTORS = {**settings.CONNECTORS, "COMMENT_FULL_MAX_PAGES": 20}
        with tracker.capture(execute=True):
            assert comment_poll.comments_reconcile(instance=tracker.instance, adapter=adapter)["deleted"] == 1
        assert list(ExternalCommentLink.objects.filter(deleted=True).values_list("external_comment_id",
                                                                                  flat=True)) == [ids[2]]


# --- pages, cursors, rate bounds --------------------------------------------------------------------------
def test_comment_pages_commit_with_their_cursor_and_a_crash_between_reapplies_idempotently(tracker, monkeypatch):
    task_id, link = tracker.link_task()
    ids = [tracker.comment(task_id, f"Finding {n}: the cache is stale.") for n in range(5)]
    tracker.drop()
    adapter = tracker.small_pages(2)
    scope = comment_poll.link_scope(link.pk)
    real = comment_poll.cursor_save
    saves = []

    def killed_at_the_second_page(instance, name, value):
        if name == scope:
            saves.append(value)
            if len(saves) == 2:
                raise RuntimeError("worker killed before the cursor was saved")
        return real(instance, name, value)

    monkeypatch.setattr(comment_poll, "cursor_save", killed_at_the_second_page)
    with pytest.raises(RuntimeError), tracker.capture(execute=True):
        comment_poll.comments_poll(instance=tracker.instance, adapter=adapter)
    # the first page committed with its cursor; the second rolled back with its own
    new = [i for i in commented_ids(link.issue)]
    assert new == ids[:len(new)] and 1 <= len(new) < 5
    assert SyncCursor.objects.get(instance=tracker.instance, scope=scope).cursor == saves[0]

    monkeypatch.setattr(comment_poll, "cursor_save", real)
    with tracker.capture(execute=True):
        comment_poll.comments_poll(instance=tracker.instance, adapter=adapter)
    assert commented_ids(link.issue) == ids  # every comment once, in order
    # a lost cursor re-lists from the start and re-applies without a duplicate
    SyncCursor.objects.filter(instance=tracker.instance, scope=scope).delete()
    with tracker.capture(execute=True):
        comment_poll.comments_poll(instance=tracker.instance, adapter=adapter)
    assert commented_ids(link.issue) == ids
    assert ExternalCommentLink.objects.filter(link=link).count() == 5


def test_each_poll_tick_lists_comments_of_a_bounded_window_of_links(company, monkeypatch, settings,
                                                                   django_capture_on_commit_callbacks):
    settings.CONNECTORS = {**settings.CONNECTORS, "COMMENT_POLL_BATCH": 2}
    with make_tracker("github", company, monkeypatch, django_capture_on_commit_callbacks) as tracker:
        links = sorted((tracker.link_task(f"Task {n}")[1] for n in range(5)), key=lambda link: str(link.pk))
        last_task = links[-1].external_task_id
        late = tracker.comment(last_task, "Anyone?")
        tracker.drop()
        windows = []
        for _ in range(4):
            before = len(tracker.listed_tasks())
            result = poll(tracker)
            windows.append(sorted(set(tracker.listed_tasks()[before:])))
            assert result["comments"]["links"] == len(windows[-1])
            if len(windows) < 3:
                assert not external_comments(links[-1].issue).exists()  # its link's turn has not come
        expected = [sorted({tracker.ref_of(link) for link in chunk}) for chunk in (links[0:2], links[2:4], links[4:5])]
        assert windows == [*expected, expected[0]]  # two links per tick, then around again
        assert commented_ids(links[-1].issue) == [late]


def test_a_rate_limited_listing_ends_the_tick_without_skipping_the_link(company, monkeypatch,
                                                                        django_capture_on_commit_callbacks):
    with make_tracker("github", company, monkeypatch, django_capture_on_commit_callbacks) as tracker:
        task_id, link = tracker.link_task()
        comment_id = tracker.comment(task_id, "Ping")
        tracker.drop()
        tracker.fail_next(1, retry_after=120)
        with tracker.capture(execute=True):
            result = comment_poll.comments_poll(instance=tracker.instance)
        assert result["links"] == 0 and not external_comments(link.issue).exists()
        assert SyncError.objects.filter(instance=tracker.instance, category="provider_rate_limited").exists()
        instance = ConnectorInstance.objects.get(pk=tracker.instance.pk)
        assert instance.provider_degraded_until is not None  # retry-after honoured: comment polling is shed
        assert not SyncCursor.objects.filter(instance=instance, scope__startswith="comments:").exists()
        listings = tracker.comment_listings()
        assert comment_poll.comments_poll(instance=instance)["shed"] is True
        assert tracker.comment_listings() == listings  # not even asked while the provider said wait

        ConnectorInstance.objects.filter(pk=instance.pk).update(provider_degraded_until=None)  # the wait is over
        with tracker.capture(execute=True):
            assert comment_poll.comments_poll(instance=instance)["links"] == 1
        assert commented_ids(link.issue) == [comment_id]
