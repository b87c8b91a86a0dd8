"""Write policy toggles that must do what they say (External Task Protocol §10.2), against the GitHub,
Linear and Jira sandboxes over real HTTP: ``mirrorExternalComments`` off stops importing tracker
comments by webhook and by the backstop while ``/paperclip`` commands still run under the command
policy; ``postTranscripts`` (off by default) posts one bounded, redacted run summary per finished run."""
from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from connectors.models import ConnectorInstance, InboundEvent, OutboundEffect, TaskLink, default_write_policy
from connectors.services import polling, transcripts
from connectors.services.apply_comments import MIRROR_OFF_TEXT
from issues.models import ActivityLog
from issues.services.runs import run_append_event, run_finish
from tests.factories import AgentFactory, RunFactory
from tests.sandbox_trackers import external_comments, make_tracker, tracker  # noqa: F401  (fixture import)


def poll(tracker):
    with tracker.capture(execute=True):
        return polling.instance_poll(instance_id=tracker.instance.pk)


def reconcile(tracker):
    with tracker.capture(execute=True):
        return polling.instance_reconcile(instance_id=tracker.instance.pk)


def set_instance(tracker, **fields):
    ConnectorInstance.objects.filter(pk=tracker.instance.pk).update(**fields)


def outcome_of(tracker, comment_id: str) -> tuple[str, str]:
    event = InboundEvent.objects.filter(instance=tracker.instance, kind="comment.upserted",
                                        payload__comment__external_comment_id=comment_id).order_by("-id").first()
    return event.status, event.outcome


def commands(comment_ids) -> list[str]:
    return [row.details["outcome"] for row in ActivityLog.objects.filter(
        action="connector.command", details__externalCommentId__in=list(comment_ids)).order_by("created_at", "id")]


# --- mirrorExternalComments ----------------------------------------------------------------------------
def test_mirror_external_comments_off_stops_imports_but_commands_still_run(tracker, company):
    AgentFactory(company=company, name="reviewer")
    task_id, link = tracker.link_task()
    set_instance(tracker, write_policy={**default_write_policy(), "mirrorExternalComments": False})

    by_webhook = tracker.comment(task_id, "Delivered while mirroring is off.")
    tracker.forward()
    assert outcome_of(tracker, by_webhook) == ("dropped", MIRROR_OFF_TEXT)
    by_poll = tracker.comment(task_id, "Lost on the way while mirroring is off.")
    tracker.drop()
    poll(tracker)
    assert outcome_of(tracker, by_poll) == ("dropped", MIRROR_OFF_TEXT)
    assert not external_comments(link.issue).exists()

    # /paperclip commands are not comments: they run, by webhook or after the poll, and are answered
    assign = tracker.comment(task_id, "/paperclip assign reviewer")
    tracker.drop()
    poll(tracker)
    status = tracker.comment(task_id, "/paperclip status")
    tracker.forward()
    link.issue.refresh_from_db()
    assert link.issue.assignee_agent.name == "reviewer"
    assert commands([assign]) == ["assigned to reviewer"] and commands([status])[0].startswith(link.issue.identifier)
    assert OutboundEffect.objects.filter(link=link, source_id__in=[f"command:{assign}:0", f"command:{status}:0"],
                                         status="done").count() == 2
    # ...and still obey the command policy
    set_instance(tracker, command_policy="disabled")
    refused = tracker.comment(task_id, "/paperclip assign coder")
    tracker.forward()
    assert commands([refused]) == ["rejected: commands are disabled for this connector"]
    link.issue.refresh_from_db()
    assert link.issue.assignee_agent.name == "reviewer"

    # on again: new comments arrive; what was said while it was off stays out, even after a repair pass
    set_instance(tracker, write_policy=default_write_policy())
    back = tracker.comment(task_id, "Mirroring is back on.")
    tracker.drop()
    poll(tracker)
    reconcile(tracker)
    assert [c.provenance["externalCommentId"] for c in external_comments(link.issue)] == [back]


def test_a_link_can_turn_comment_mirroring_off_for_itself(company, monkeypatch, django_capture_on_commit_callbacks):
    with make_tracker("github", company, monkeypatch, django_capture_on_commit_callbacks) as tracker:
        task_id, link = tracker.link_task("Quiet task")
        other_id, other = tracker.link_task("Chatty task")
        TaskLink.objects.filter(pk=link.pk).update(write_policy={"mirrorExternalComments": False})
        quiet = tracker.comment(task_id, "Not for Paperclip.")
        chatty = tracker.comment(other_id, "For Paperclip.")
        tracker.forward()
        assert not external_comments(link.issue).exists()
        assert [c.provenance["externalCommentId"] for c in external_comments(other.issue)] == [chatty]
        assert outcome_of(tracker, quiet) == ("dropped", MIRROR_OFF_TEXT)


# --- postTranscripts -------------------------------------------------------------------------------------
DEPLOY_SECRET = "hunter2-deploy-value"
GITHUB_TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJib3QifQ.c2lnbmF0dXJlLXBhcnQ"


def finished_run(tracker, issue, agent, lines, **fields):
    run = RunFactory(agent=agent, issue=issue, status="running", started_at=timezone.now() - timedelta(minutes=3),
                     input_tokens=1200, output_tokens=340, result_status="done",
                     result_summary="Fixed the config loader.", **fields)
    for kind, message in lines:
        run_append_event(run_id=run.pk, kind=kind, message=message)
    with tracker.capture(execute=True):
        return run_finish(run=run, status="succeeded")


def transcript_comments(tracker, task_id) -> list[str]:
    number = tracker._numbers[task_id]
    return [c["body"] for c in tracker.sandbox.comments_of(number) if "Run transcript" in c["body"]]


def test_transcripts_stay_off_by_default(company, monkeypatch, django_capture_on_commit_callbacks):
    with make_tracker("github", company, monkeypatch, django_capture_on_commit_callbacks) as tracker:
        task_id, link = tracker.link_task()
        finished_run(tracker, link.issue, AgentFactory(company=company), [("stdout", "building")])
        assert not OutboundEffect.objects.filter(source_id__startswith="transcript:").exists()
        assert transcript_comments(tracker, task_id) == []


def test_a_finished_run_posts_one_bounded_redacted_transcript_when_on(company, monkeypatch, settings,
                                                                     django_capture_on_commit_callbacks):
    settings.CONNECTORS = {**settings.CONNECTORS, "TRANSCRIPT_MAX_CHARS": 1500}
    runner = AgentFactory(company=company, name="runner", adapter_type="process",
                          adapter_config={"command": ["true"], "env": {"DEPLOY_TOKEN": DEPLOY_SECRET}})
    with make_tracker("github", company, monkeypatch, django_capture_on_commit_callbacks) as tracker:
        task_id, link = tracker.link_task()
        TaskLink.objects.filter(pk=link.pk).update(write_policy={"postTranscripts": True})
        filler = [("stdout", f"step {n}: compiling module_{n} with the default profile") for n in range(120)]
        secrets = [("stdout", f"cloning https://bot:{GITHUB_TOKEN}@github.com/octo/repo"),
                   ("stderr", f"retrying with Authorization: Bearer {JWT}"),
                   ("stdout", f"the deploy key is {DEPLOY_SECRET} (from the agent's env)"),
                   ("stdout", f"export GITHUB_TOKEN={GITHUB_TOKEN}"),
                   ("stdout", "FINAL LINE: 42 tests passed")]
        run = finished_run(tracker, link.issue, runner, filler + secrets)

        effect = OutboundEffect.objects.get(link=link, source_id=f"transcript:{run.pk}")
        assert effect.status == "done" and effect.payload["milestone"] == "transcript"
        [posted] = transcript_comments(tracker, task_id)
        # attributed and marked like every mirrored comment
        assert f"**runner via Paperclip** · [{link.issue.identifier}]" in posted
        assert f"<!-- paperclip:effect:{effect.pk} -->" in posted
        assert "succeeded" in posted and "Summary: Fixed the config loader." in posted and "1,200 in / 340 out" in posted
        # bounded: the newest lines are kept, the oldest give way with a note
        assert len(effect.payload["lines"][0]) <= 1500
        assert "FINAL LINE: 42 tests passed" in posted and "step 0:" not in posted
        assert "earlier characters omitted" in posted
        # redacted: the agent's configured secret and anything shaped like a credential
        for secret in (DEPLOY_SECRET, GITHUB_TOKEN, JWT):
            assert secret not in posted
        assert "cloning https://[redacted]@github.com/octo/repo" in posted  # the line still reads
        assert "export GITHUB_TOKEN=[redacted]" in posted and "Authorization: Bearer [redacted]" in posted
        # the same run is never posted twice: it cannot finish again, and recording it again is a no-op
        with tracker.capture(execute=True):
            run_finish(run=run, status="failed")
            transcripts.run_transcript_posted(run=run)
        assert OutboundEffect.objects.filter(link=link, source_id__startswith="transcript:").count() == 1
        assert len(transcript_comments(tracker, task_id)) == 1

        # turned off again: the next run posts nothing
        TaskLink.objects.filter(pk=link.pk).update(write_policy={"postTranscripts": False})
        finished_run(tracker, link.issue, runner, [("stdout", "quiet run")])
        assert len(transcript_comments(tracker, task_id)) == 1


def test_a_short_transcript_is_posted_whole(company, monkeypatch, django_capture_on_commit_callbacks):
    with make_tracker("github", company, monkeypatch, django_capture_on_commit_callbacks,
                      write_policy={**default_write_policy(), "postTranscripts": True}) as tracker:
        task_id, link = tracker.link_task()
        finished_run(tracker, link.issue, AgentFactory(company=company, name="coder-2"),
                     [("stdout", "installing deps"), ("stderr", "warning: ``` in output"), ("stdout", "done")])
        [posted] = transcript_comments(tracker, task_id)
        assert "installing deps\n[stderr] warning: ``` in output\ndone" in posted
        assert "omitted" not in posted
        assert "\n````\n" in posted  # a fence longer than any backtick run in the log keeps the block whole
