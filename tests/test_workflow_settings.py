"""Symphony WORKFLOW.md settings apply on the host: a real Symphony document committed in a real git
repository drives runs through the dispatcher (its hooks run in the worktree, its hook timeout is
honoured), project settings beat it, the agent's runtime config beats both, a wrong-typed key keeps
the last good version with one activity entry naming the key, unknown keys are kept and shown."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from django.urls import reverse

from issues.actors import SYSTEM
from issues.models import ActivityLog, ExecutionWorkspace, HeartbeatRun, Issue, Project, WorkflowDocumentCache
from issues.services import dispatch, runs
from issues.services.run_policy import run_policy_for
from issues.services.wakeups import agent_wakeup
from issues.workflow.document import parse_document
from issues.workflow.errors import PolicyInvalid
from issues.workflow.settings import describe
from issues.workspaces import gitops, service
from issues.workspaces.hooks import hook_command
from tests.factories import AgentFactory, IssueFactory, ProjectFactory, RunFactory
from tests.test_workspaces import _git_isolation, commit_file, hooks_of, make_repo  # noqa: F401 (fixture)

AGENT = str(Path(__file__).resolve().parent.parent / "examples" / "heartbeat_agent.py")

# In the style of openai/symphony's elixir/WORKFLOW.md: tracker, polling, workspace, hooks, agent,
# codex sections, plus one key Symphony does not define.
SYMPHONY_WORKFLOW = """\
---
tracker:
  kind: linear
  project_slug: "paperclip-demo-3c1f"
  active_states:
    - Todo
    - In Progress
    - Rework
  terminal_states:
    - Closed
    - Cancelled
    - Done
polling:
  interval_ms: 5000
workspace:
  root: ~/code/symphony-workspaces
hooks:
  timeout_ms: 20000
  after_create: |
    echo "created $(basename "$PWD")" > .symphony-created
  before_run: |
    set -eu
    branch="$(git rev-parse --abbrev-ref HEAD)"
    echo "before_run for $PAPERCLIP_ISSUE_IDENTIFIER on $branch" > .symphony-before-run
agent:
  max_concurrent_agents: 4
  max_turns: 5
  stall_timeout_ms: 90500
codex:
  command: codex app-server
  approval_policy: never
  read_timeout_ms: 60000
review_board: "#eng-review"
---

You are working on a Linear ticket `{{ issue.identifier }}`

{% if attempt %}
Continuation context:

- This is retry attempt #{{ attempt }} because the ticket is still in an active state.
- Resume from the current workspace state instead of restarting from scratch.
{% endif %}

Issue context:
Identifier: {{ issue.identifier }}
Title: {{ issue.title }}
Current status: {{ issue.state }}
Labels: {{ issue.labels }}
URL: {{ issue.url }}

Description:
{% if issue.description %}
{{ issue.description }}
{% else %}
No description provided.
{% endif %}
"""


def workflow(**replace) -> str:
    """The Symphony document with some lines replaced (``old=new`` pairs, whole lines)."""
    text = SYMPHONY_WORKFLOW
    for old, new in replace.values():
        assert old in text, old
        text = text.replace(old, new)
    return text


def quick_hook(before_run: str, timeout_ms: int) -> str:
    return workflow(timeout=("  timeout_ms: 20000", f"  timeout_ms: {timeout_ms}"),
                    hook=('    echo "before_run for $PAPERCLIP_ISSUE_IDENTIFIER on $branch" > .symphony-before-run',
                          f"    {before_run}"))


@pytest.fixture
def root(settings, tmp_path) -> Path:
    path = tmp_path / "workspaces"
    settings.PAPERCLIP = {**settings.PAPERCLIP, "WORKSPACE_ROOT": str(path)}
    return path


@pytest.fixture
def repo(tmp_path) -> Path:
    return make_repo(tmp_path / "project-repo")


@pytest.fixture
def project(company, repo):
    # hook_timeout_seconds unset (None) and no hooks: the repository's WORKFLOW.md decides.
    return ProjectFactory(company=company, repository=str(repo), base_ref="main",
                          workspace_strategy="isolated_workspace")


def quick_agent(company, **kwargs):
    """A process agent that only proves it ran in the workspace."""
    return AgentFactory(company=company, adapter_type="process", adapter_config={
        "command": [sys.executable, "-c", "open('agent-ran.txt', 'w').write('ok')"]}, **kwargs)


def wake_and_execute(agent, issue) -> HeartbeatRun:
    """What a worker does: the wake queues a run, the dispatcher picks it, run_execute runs it."""
    agent_wakeup(actor=SYSTEM, agent=agent, issue=issue, reason="assigned")
    [run_id] = dispatch.dispatch_runs()
    run = dispatch.run_execute(run_id=run_id, owner=runs.this_owner())
    run.refresh_from_db()
    return run


def invalid_activity(project):
    return ActivityLog.objects.filter(action="project.workflow_invalid", entity_id=str(project.pk))


# --- end to end -------------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_a_symphony_workflow_in_the_repository_drives_a_run_end_to_end(live_server, settings, root, repo, project,
                                                                       company):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "API_URL": f"{live_server.url}/api"}
    commit_file(repo, "WORKFLOW.md", SYMPHONY_WORKFLOW)
    agent = AgentFactory(company=company, adapter_type="process", adapter_config={
        "command": [sys.executable, AGENT], "env": {"EXAMPLE_AGENT_MODE": "done", "EXAMPLE_AGENT_WRITE_FILE": "1"}})
    issue = IssueFactory(company=company, project=project, assignee_agent=agent, status="todo", title="Fix login")

    run = wake_and_execute(agent, issue)

    assert run.status == "succeeded", run.error
    workspace = run.workspace
    path = Path(workspace.path)
    # the document's hooks ran in the worktree: after_create once (new workspace), then before_run
    assert (path / ".symphony-created").read_text() == f"created {workspace.key}\n"
    assert (path / ".symphony-before-run").read_text() == \
        f"before_run for {issue.identifier} on paperclip/{issue.identifier}\n"
    assert not (repo / ".symphony-before-run").exists()
    (before,) = hooks_of(workspace, "before_run")
    assert before["exitCode"] == 0 and not before["timedOut"] and before["runId"] == str(run.pk)
    assert len(hooks_of(workspace, "after_create")) == 1
    # the agent ran after the hook, in the same folder, and finished the issue over the API
    assert (path / "NOTES.md").exists()
    assert Issue.objects.get(pk=issue.pk).status == "done"

    policy = run_policy_for(agent=agent, issue=issue)
    assert (policy.stall_timeout_seconds, policy.max_turns, policy.max_concurrent_agents,
            policy.hook_timeout_seconds) == (91, 5, 4, 20)  # 90500 ms rounds up to 91 s
    assert {k: policy.sources[k] for k in ("stall_timeout_seconds", "max_turns", "max_concurrent_agents",
                                           "hook_timeout_seconds", "hooks.before_run", "hooks.after_create",
                                           "max_retries")} == {
        "stall_timeout_seconds": "workflow", "max_turns": "workflow", "max_concurrent_agents": "workflow",
        "hook_timeout_seconds": "workflow", "hooks.before_run": "workflow", "hooks.after_create": "workflow",
        "max_retries": "default"}
    stored = WorkflowDocumentCache.objects.get(project=project, source="repository")
    assert stored.front_matter["review_board"] == "#eng-review"  # unknown keys are kept whole


@pytest.mark.django_db
def test_a_hook_past_hooks_timeout_ms_fails_the_run_with_before_run_failed(root, repo, project, company):
    commit_file(repo, "WORKFLOW.md", quick_hook("sleep 30", timeout_ms=1000))
    agent = quick_agent(company)
    issue = IssueFactory(company=company, project=project, assignee_agent=agent, status="todo")

    run = wake_and_execute(agent, issue)

    assert run.status == "failed" and run.error.startswith("before_run_failed:"), run.error
    assert run.liveness_reason == "before_run_failed"
    workspace = ExecutionWorkspace.objects.get(source_issue=issue)  # realized, then the hook failed
    (entry,) = hooks_of(workspace, "before_run")
    assert entry["timedOut"] is True and entry["exitCode"] is None
    assert 900 <= entry["durationMs"] < 10_000  # killed at the document's 1 s, not the 120 s default
    assert not (Path(workspace.path) / "agent-ran.txt").exists()  # the agent never started


@pytest.mark.django_db
def test_the_project_hook_timeout_beats_the_documents(root, repo, project, company):
    commit_file(repo, "WORKFLOW.md", quick_hook("sleep 2; echo slept > slept.txt", timeout_ms=1000))
    Project.objects.filter(pk=project.pk).update(hook_timeout_seconds=20)
    agent = quick_agent(company)
    issue = IssueFactory(company=company, project=project, assignee_agent=agent, status="todo")

    run = wake_and_execute(agent, issue)

    assert run.status == "succeeded", run.error
    path = Path(run.workspace.path)
    assert (path / "slept.txt").read_text() == "slept\n" and (path / "agent-ran.txt").read_text() == "ok"
    policy = run_policy_for(agent=agent, issue=Issue.objects.get(pk=issue.pk))
    assert policy.sources["hook_timeout_seconds"] == "project"


@pytest.mark.django_db
def test_a_project_hook_beats_the_documents_hook_of_the_same_name_only(root, repo, project, company):
    commit_file(repo, "WORKFLOW.md", SYMPHONY_WORKFLOW)
    Project.objects.filter(pk=project.pk).update(workspace_hooks={"before_run": "echo project > who.txt"})
    project.refresh_from_db()
    issue = IssueFactory(company=company, project=project, status="todo")
    run = RunFactory(agent=AgentFactory(company=company), issue=issue, status="running")

    workspace = service.workspace_admit(issue=issue, run=run)

    path = Path(workspace.path)
    assert (path / "who.txt").read_text() == "project\n" and not (path / ".symphony-before-run").exists()
    assert (path / ".symphony-created").exists()  # the document's after_create still applies
    policy = run_policy_for(agent=run.agent, issue=issue)
    assert (policy.sources["hooks.before_run"], policy.sources["hooks.after_create"]) == ("project", "workflow")
    # an empty command set on the project turns the document's hook off
    Project.objects.filter(pk=project.pk).update(workspace_hooks={"after_create": ""})
    project.refresh_from_db()
    assert not hook_command(run_policy_for(agent=None, project=project).hooks, "after_create")


# --- precedence and sources ---------------------------------------------------------------------------

@pytest.mark.django_db
def test_agent_beats_project_beats_document_beats_default(repo, project, company, settings):
    commit_file(repo, "WORKFLOW.md", SYMPHONY_WORKFLOW.replace(
        "  stall_timeout_ms: 90500\n", "  stall_timeout_ms: 90500\n  heartbeat_interval_ms: 15000\n"
                                       "  heartbeat_stale_ms: 120001\n"))
    agent = AgentFactory(company=company, runtime_config={})
    policy = run_policy_for(agent=agent, project=project)
    assert (policy.stall_timeout_seconds, policy.heartbeat_interval_seconds, policy.heartbeat_stale_seconds) == \
        (91, 15, 121)
    assert policy.timeout_seconds == settings.PAPERCLIP["RUN_TIMEOUT_SECONDS"]
    assert policy.sources["timeout_seconds"] == policy.sources["max_retries"] == "default"

    Project.objects.filter(pk=project.pk).update(run_settings={"stallTimeoutSeconds": 45, "maxContinuations": 1})
    project.refresh_from_db()
    policy = run_policy_for(agent=agent, project=project)
    assert (policy.stall_timeout_seconds, policy.max_turns, policy.heartbeat_interval_seconds) == (45, 1, 15)
    assert (policy.sources["stall_timeout_seconds"], policy.sources["max_turns"],
            policy.sources["heartbeat_interval_seconds"]) == ("project", "project", "workflow")

    agent.runtime_config = {"stallTimeoutSeconds": 0}  # the agent's 0 (stall detection off) beats both
    policy = run_policy_for(agent=agent, project=project)
    assert (policy.stall_timeout_seconds, policy.sources["stall_timeout_seconds"]) == (0, "agent")
    assert (policy.max_turns, policy.sources["max_turns"]) == (1, "project")


@pytest.mark.django_db
def test_stall_timeout_of_zero_or_less_disables_and_symphonys_codex_spelling_is_read(project, company):
    for front, expected in [("agent:\n  stall_timeout_ms: -1", 0), ("agent:\n  stall_timeout_ms: 0", 0),
                            ("codex:\n  stall_timeout_ms: 1000", 1),
                            ("agent:\n  stall_timeout_ms: 2001\ncodex:\n  stall_timeout_ms: 1000", 3)]:
        Project.objects.filter(pk=project.pk).update(workflow_document=f"---\n{front}\n---\nPrompt")
        project.refresh_from_db()
        policy = run_policy_for(agent=None, project=project)
        assert (policy.stall_timeout_seconds, policy.sources["stall_timeout_seconds"]) == (expected, "workflow")


@pytest.mark.django_db
def test_the_project_document_beats_the_repository_and_its_front_matter_applies_whole(repo, project):
    commit_file(repo, "WORKFLOW.md", SYMPHONY_WORKFLOW)
    Project.objects.filter(pk=project.pk).update(workflow_document="---\nagent:\n  max_turns: 2\n---\n")
    project.refresh_from_db()
    policy = run_policy_for(agent=None, project=project)
    # the highest document present decides: the repository's hooks and stall timeout do not mix in
    assert (policy.max_turns, policy.sources["max_turns"]) == (2, "workflow")
    assert policy.hooks == {} and policy.sources["stall_timeout_seconds"] == "default"


@pytest.mark.django_db
def test_the_repository_is_read_again_only_when_head_moves(repo, project, monkeypatch):
    shows = []
    real_git = gitops.git

    def counting_git(*args, **kwargs):
        if args[:1] == ("show",):
            shows.append(args)
        return real_git(*args, **kwargs)

    monkeypatch.setattr(gitops, "git", counting_git)
    commit_file(repo, "WORKFLOW.md", "---\nagent:\n  max_turns: 3\n---\nPrompt")
    assert [run_policy_for(agent=None, project=project).max_turns for _ in range(3)] == [3, 3, 3]
    assert len(shows) == 1  # admission, hooks and the stall checks share one read per HEAD
    commit_file(repo, "WORKFLOW.md", "---\nagent:\n  max_turns: 4\n---\nPrompt")
    assert run_policy_for(agent=None, project=project).max_turns == 4 and len(shows) == 2


# --- invalid versions ---------------------------------------------------------------------------------

def test_a_known_key_of_the_wrong_type_is_an_invalid_version_naming_the_key():
    with pytest.raises(PolicyInvalid) as exc:
        parse_document(SYMPHONY_WORKFLOW.replace("stall_timeout_ms: 90500", "stall_timeout_ms: soon"))
    assert exc.value.code == "workflow_setting_invalid" and exc.value.key == "agent.stall_timeout_ms"
    assert "agent.stall_timeout_ms must be an integer" in exc.value.reason and "got 'soon'" in exc.value.reason
    for front, key in [("hooks:\n  timeout_ms: 0", "hooks.timeout_ms"),
                       ("agent:\n  max_turns: true", "agent.max_turns"),
                       ("hooks:\n  before_run: {a: 1}", "hooks.before_run"), ("agent: 5", "agent"),
                       ("tracker:\n  active_states: Todo", "tracker.active_states")]:
        with pytest.raises(PolicyInvalid) as exc:
            parse_document(f"---\n{front}\n---\nx")
        assert exc.value.key == key, front
    # unknown keys, nulls and lists of commands are fine
    doc = parse_document("---\nfuture: {x: 1}\nagent:\n  max_turns:\n  mystery: 2\nhooks:\n  before_run: [a, b]\n"
                         "tracker:\n  team_key: ENG\n---\nx")
    view = describe(doc.config)
    assert view.unknown == {"future": {"x": 1}, "agent.mystery": 2}
    assert view.applied == {"agent.max_turns": None, "hooks.before_run": ["a", "b"]}
    assert view.recognised == {"tracker.team_key": "ENG"}  # tracker keys belong to its adapter


@pytest.mark.django_db
def test_a_wrong_typed_key_keeps_the_last_good_document_with_one_activity_entry(root, repo, project, company):
    commit_file(repo, "WORKFLOW.md", quick_hook("echo good > which.txt", timeout_ms=5000))
    agent = quick_agent(company)
    first = IssueFactory(company=company, project=project, assignee_agent=agent, status="todo")
    assert wake_and_execute(agent, first).status == "succeeded"
    good = WorkflowDocumentCache.objects.get(project=project, source="repository").content_hash

    bad = quick_hook("echo bad > which.txt", timeout_ms=5000).replace("stall_timeout_ms: 90500",
                                                                       "stall_timeout_ms: soon")
    commit_file(repo, "WORKFLOW.md", bad, "break the stall timeout")
    second = IssueFactory(company=company, project=project, assignee_agent=agent, status="todo")
    run = wake_and_execute(agent, second)

    assert run.status == "succeeded", run.error
    assert (Path(run.workspace.path) / "which.txt").read_text() == "good\n"  # the last good hook ran
    policy = run_policy_for(agent=agent, issue=second)
    assert (policy.stall_timeout_seconds, policy.sources["stall_timeout_seconds"]) == (91, "workflow")
    (entry,) = invalid_activity(project)  # once, although admission and every hook read the document
    assert entry.details["key"] == "agent.stall_timeout_ms" and entry.details["code"] == "workflow_setting_invalid"
    assert "got 'soon'" in entry.details["error"] and entry.details["lastGoodVersion"] == good
    assert entry.details["source"] == "repository"
    row = WorkflowDocumentCache.objects.get(project=project, source="repository")
    assert row.content_hash == good and "agent.stall_timeout_ms" in row.last_error

    commit_file(repo, "WORKFLOW.md", SYMPHONY_WORKFLOW, "fix it")
    assert run_policy_for(agent=agent, project=project).hook_timeout_seconds == 20
    assert invalid_activity(project).count() == 1
    assert WorkflowDocumentCache.objects.get(project=project, source="repository").error_hash == ""


# --- the admin ------------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_the_admin_shows_effective_settings_unknown_keys_and_the_last_error(admin_client, repo, project):
    commit_file(repo, "WORKFLOW.md", SYMPHONY_WORKFLOW)
    Project.objects.filter(pk=project.pk).update(run_settings={"maxContinuations": 1})
    url = reverse("admin:issues_project_change", args=[project.pk])
    page = admin_client.get(url).content.decode()
    assert "Effective run settings" in page and 'name="run_settings"' in page
    assert "Workflow document in force: repository WORKFLOW.md" in page
    assert "<td><code>stall_timeout_seconds (stallTimeoutSeconds)</code></td><td><code>91</code></td>" \
           "<td>workflow</td>" in page
    assert "<td><code>max_turns (maxContinuations)</code></td><td><code>1</code></td><td>project</td>" in page
    assert "<td><code>hooks.before_run</code></td>" in page
    assert "Unknown keys (kept, not applied)" in page and "<code>review_board</code>" in page
    assert "Recognised, not applied by the host" in page and "<code>polling.interval_ms</code>" in page

    commit_file(repo, "WORKFLOW.md", SYMPHONY_WORKFLOW.replace("max_turns: 5", "max_turns: many"))
    page = admin_client.get(url).content.decode()
    assert "Invalid repository WORKFLOW.md version" in page
    assert "agent.max_turns must be a positive integer, got &#x27;many&#x27;" in page
    assert "(the last good version: a newer one is invalid)" in page

    cache = WorkflowDocumentCache.objects.get(project=project)
    cache_url = reverse("admin:issues_workflowdocumentcache_change", args=[cache.pk])
    assert admin_client.get(cache_url).status_code == 200
    assert admin_client.post(cache_url, {}).status_code == 403  # read-only


@pytest.mark.django_db
def test_the_admin_refuses_unknown_or_wrong_typed_run_settings(admin_client, project):
    url = reverse("admin:issues_project_change", args=[project.pk])
    form = {"company": project.company_id, "name": project.name, "description": "", "status": "active",
            "workspace_strategy": project.workspace_strategy, "repository": project.repository, "base_ref": "main",
            "branch_template": project.branch_template, "workspace_hooks": "{}", "hook_timeout_seconds": "",
            "workflow_document": ""}
    page = admin_client.post(url, {**form, "run_settings": '{"stallTimeout": 5, "maxRetries": -1}'}).content.decode()
    assert "stallTimeout: unknown setting" in page and "maxRetries: must be an integer of 0 or more." in page
    response = admin_client.post(url, {**form, "run_settings": '{"stallTimeoutSeconds": 600}'})
    assert response.status_code == 302
    project.refresh_from_db()
    assert project.run_settings == {"stallTimeoutSeconds": 600} and project.hook_timeout_seconds is None
