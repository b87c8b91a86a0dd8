"""Execution workspaces against real git repositories, worktrees and hook shell commands."""
from __future__ import annotations

import os
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
import time_machine
from django.utils import timezone

from issues.choices import WorkspaceStatus, WorkspaceStrategy
from issues.exceptions import NotFound
from issues.models import ActivityLog, ExecutionWorkspace, HeartbeatRun, Issue
from issues.workspaces import service
from issues.workspaces.errors import HookFailed, WorkspaceBusy, WorkspaceConfigError, WorkspacePathEscape
from issues.workspaces.keys import workspace_key
from issues.workspaces.paths import safe_path
from tests.factories import AgentFactory, CompanyFactory, IssueFactory, ProjectFactory, RunFactory

GIT_IDENTITY = ("-c", "user.name=Paperclip Test", "-c", "user.email=test@paperclip.invalid",
                "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main")


def git(*args, cwd=None) -> str:
    proc = subprocess.run(["git", *GIT_IDENTITY, *args], cwd=cwd, check=True, capture_output=True, text=True)
    return proc.stdout.strip()


def commit_file(repo: Path, name: str, text: str, message: str | None = None) -> str:
    (repo / name).write_text(text)
    git("add", name, cwd=repo)
    git("commit", "-q", "-m", message or f"add {name}", cwd=repo)
    return git("rev-parse", "HEAD", cwd=repo)


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    git("init", "-q", "-b", "main", cwd=path)
    commit_file(path, "README.md", "hello\n", "initial")
    return path


def branch_exists(repo: Path, branch: str) -> bool:
    return subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}"], cwd=repo,
                          capture_output=True, check=False).returncode == 0


def ended(run: HeartbeatRun, status: str = "succeeded") -> HeartbeatRun:
    HeartbeatRun.objects.filter(pk=run.pk).update(status=status, finished_at=timezone.now())
    run.refresh_from_db()
    return run


def hooks_of(workspace: ExecutionWorkspace, name: str) -> list[dict]:
    workspace.refresh_from_db()
    return [e for e in workspace.hook_log if e["hook"] == name]


@pytest.fixture(autouse=True)
def _git_isolation(monkeypatch, tmp_path):
    """Tests work on a machine without git config: no global/system config is read."""
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    (tmp_path / "gitconfig").write_text("")
    for var in ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"):
        monkeypatch.setenv(var, "Paperclip Test")
    for var in ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"):
        monkeypatch.setenv(var, "test@paperclip.invalid")


@pytest.fixture
def root(settings, tmp_path) -> Path:
    path = tmp_path / "workspaces"
    settings.PAPERCLIP = {**settings.PAPERCLIP, "WORKSPACE_ROOT": str(path), "WORKSPACE_RETENTION_SECONDS": 3600,
                          "WORKSPACE_DISK_CAP_BYTES": 10**12}
    return path


@pytest.fixture
def repo(tmp_path) -> Path:
    return make_repo(tmp_path / "project-repo")


@pytest.fixture
def company(db):
    return CompanyFactory(issue_prefix="WS")


@pytest.fixture
def agent(company):
    return AgentFactory(company=company)


@pytest.fixture
def make_project(company, repo):
    def make(**kwargs):
        kwargs.setdefault("workspace_strategy", WorkspaceStrategy.ISOLATED)
        kwargs.setdefault("repository", str(repo))
        kwargs.setdefault("base_ref", "main")
        kwargs.setdefault("workspace_hooks", {})
        kwargs.setdefault("hook_timeout_seconds", 10)
        return ProjectFactory(company=company, **kwargs)

    return make


@pytest.fixture
def project(make_project):
    return make_project()


@pytest.fixture
def new_issue(company):
    def make(**kwargs):
        kwargs.setdefault("status", "todo")
        return IssueFactory(company=company, **kwargs)

    return make


@pytest.fixture
def new_run(agent):
    def make(issue, **kwargs):
        kwargs.setdefault("status", "running")
        return RunFactory(agent=agent, issue=issue, **kwargs)

    return make


@pytest.fixture
def admitted(new_run):
    """Admit a fresh run of ``issue``; returns (workspace, run)."""
    def admit(issue):
        run = new_run(issue)
        return service.workspace_admit(issue=issue, run=run), run

    return admit


# --- keys and paths -------------------------------------------------------------------------------

class TestKeysAndPaths:
    def test_safe_identifier_is_its_own_key(self):
        assert workspace_key("PAP-12") == "PAP-12"
        assert workspace_key("a.b_c-1") == "a.b_c-1"

    def test_unsafe_characters_become_underscores_with_a_hash_suffix(self):
        key = workspace_key("PAP 12/x:y")
        body, _, suffix = key.partition("--")
        assert body == "PAP_12_x_y"
        assert len(suffix) == 16 and all(c in "0123456789abcdef" for c in suffix)
        assert workspace_key("PAP 12/x:y") == key  # stable
        # The already-safe spelling has no suffix, so the two never collide.
        assert workspace_key("PAP_12_x_y") == "PAP_12_x_y" != key
        assert workspace_key("a/b") != workspace_key("a:b")

    def test_dot_names_and_long_identifiers(self):
        for dots in (".", ".."):
            key = workspace_key(dots)
            assert "." not in key.partition("--")[0] and "--" in key
        long = workspace_key("X" * 300)
        assert len(long) <= 120 and "--" in long
        assert workspace_key("") != ""

    def test_safe_path_inside_the_root(self, tmp_path):
        root = tmp_path / "root"
        root.mkdir()
        assert safe_path(root, "PAP-1") == (root / "PAP-1").resolve()
        assert safe_path(root, "a", "b") == (root / "a" / "b").resolve()

    @pytest.mark.parametrize("parts", [("..",), ("..", "other"), ("a", "..", "..", "x"), (".",), ("a", ".."),
                                       ("/etc",), ("",)])
    def test_safe_path_rejects_escapes_and_the_root_itself(self, tmp_path, parts):
        root = tmp_path / "root"
        root.mkdir()
        with pytest.raises(WorkspacePathEscape) as exc:
            safe_path(root, *parts)
        assert exc.value.code == "workspace_path_escape"

    def test_safe_path_rejects_a_symlink_escape(self, tmp_path):
        root, outside = tmp_path / "root", tmp_path / "outside"
        root.mkdir()
        outside.mkdir()
        (root / "link").symlink_to(outside)
        (root / "inner").mkdir()
        (root / "inner-link").symlink_to(root / "inner")
        with pytest.raises(WorkspacePathEscape):
            safe_path(root, "link")
        with pytest.raises(WorkspacePathEscape):
            safe_path(root, "link", "deeper")
        # A symlink that stays inside the root is not an escape.
        assert safe_path(root, "inner-link", "x") == (root / "inner" / "x").resolve()

    def test_admission_refuses_a_symlinked_workspace_folder(self, root, project, new_issue, admitted, tmp_path):
        issue = new_issue(project=project)
        root.mkdir(parents=True)
        (tmp_path / "elsewhere").mkdir()
        (root / workspace_key(issue.identifier)).symlink_to(tmp_path / "elsewhere")
        with pytest.raises(WorkspacePathEscape):
            admitted(issue)
        assert not ExecutionWorkspace.objects.exists()


# --- isolated worktrees ------------------------------------------------------------------------

class TestIsolated:
    def test_worktree_on_its_own_branch_from_the_base_ref(self, root, repo, make_project, new_issue, admitted):
        git("checkout", "-q", "-b", "develop", cwd=repo)
        develop_head = commit_file(repo, "develop.txt", "dev\n")
        git("checkout", "-q", "main", cwd=repo)
        project = make_project(base_ref="develop", workspace_hooks={
            "after_create": 'echo "$PAPERCLIP_ISSUE_IDENTIFIER" > created.txt',
            "before_run": 'echo "$PAPERCLIP_WORKSPACE_PATH" > before.txt; echo started'})
        issue = new_issue(project=project)

        workspace, run = admitted(issue)

        path = Path(workspace.path)
        assert path == (root / issue.identifier).resolve()
        assert workspace.strategy == WorkspaceStrategy.ISOLATED and workspace.status == WorkspaceStatus.ACTIVE
        assert workspace.branch == f"paperclip/{issue.identifier}"
        assert workspace.base_ref == "develop"
        assert workspace.source_issue_id == issue.pk
        assert git("rev-parse", "--abbrev-ref", "HEAD", cwd=path) == workspace.branch
        assert git("rev-parse", "HEAD", cwd=path) == develop_head
        assert (path / "develop.txt").exists()
        assert git("rev-parse", "--abbrev-ref", "HEAD", cwd=repo) == "main"  # the project checkout is untouched
        # Hooks ran in the workspace with the documented environment, and were logged.
        assert (path / "created.txt").read_text().strip() == issue.identifier
        assert Path((path / "before.txt").read_text().strip()) == path
        (before,) = hooks_of(workspace, "before_run")
        assert before["exitCode"] == 0 and before["timedOut"] is False and "started" in before["output"]
        assert before["command"].startswith("echo") and isinstance(before["durationMs"], int)
        assert before["runId"] == str(run.pk)
        run.refresh_from_db()
        issue.refresh_from_db()
        assert run.workspace_id == workspace.pk and issue.execution_workspace_id == workspace.pk
        assert workspace.writer_run_id == run.pk

    def test_branch_template_and_invalid_template(self, root, make_project, new_issue, admitted):
        project = make_project(branch_template="agents/{key}-{number}")
        issue = new_issue(project=project)
        workspace, _ = admitted(issue)
        assert workspace.branch == f"agents/{issue.identifier}-{issue.number}"

        bad = make_project(branch_template="x/{identifier.__class__}")
        with pytest.raises(WorkspaceConfigError) as exc:
            admitted(new_issue(project=bad))
        assert exc.value.code == "branch_template_invalid"

    def test_fresh_fetch_from_origin(self, root, tmp_path, make_project, new_issue, admitted):
        origin = tmp_path / "origin.git"
        git("init", "-q", "--bare", "-b", "main", str(origin))
        seed = make_repo(tmp_path / "seed")
        git("remote", "add", "origin", str(origin), cwd=seed)
        git("push", "-q", "origin", "main", cwd=seed)
        clone = tmp_path / "clone"
        git("clone", "-q", str(origin), str(clone))
        # Pushed to origin after the project clone was made: only a fresh fetch sees it.
        pushed = commit_file(seed, "late.txt", "late\n")
        git("push", "-q", "origin", "main", cwd=seed)
        assert not (clone / "late.txt").exists()

        project = make_project(repository=str(clone), base_ref="main")
        workspace, _ = admitted(new_issue(project=project))

        path = Path(workspace.path)
        assert (path / "late.txt").read_text() == "late\n"
        assert git("rev-parse", "HEAD", cwd=path) == pushed
        assert workspace.base_ref == "origin/main"
        # The new branch does not track origin/main (a push can never land on the base branch).
        assert subprocess.run(["git", "rev-parse", "--abbrev-ref", "@{upstream}"], cwd=path,
                              capture_output=True, check=False).returncode != 0

    def test_repository_url_is_cloned_under_the_root(self, root, tmp_path, make_project, new_issue, admitted):
        origin = tmp_path / "origin.git"
        git("init", "-q", "--bare", "-b", "main", str(origin))
        seed = make_repo(tmp_path / "seed")
        git("remote", "add", "origin", str(origin), cwd=seed)
        git("push", "-q", "origin", "main", cwd=seed)
        project = make_project(repository=origin.as_uri(), base_ref="main")

        first, _ = admitted(new_issue(project=project))
        commit_file(seed, "second.txt", "2\n")
        git("push", "-q", "origin", "main", cwd=seed)
        second, _ = admitted(new_issue(project=project))

        assert (Path(first.path) / "README.md").exists() and not (Path(first.path) / "second.txt").exists()
        assert (Path(second.path) / "second.txt").exists()
        assert all(Path(w.path).parent == root.resolve() for w in (first, second))
        assert len(list((root / ".repos").iterdir())) == 1

    def test_reuse_without_a_second_after_create(self, root, make_project, new_issue, admitted):
        project = make_project(workspace_hooks={"after_create": "echo once >> created.log",
                                                "before_run": "echo run >> runs.log"})
        issue = new_issue(project=project)
        first, run1 = admitted(issue)
        (Path(first.path) / "work.txt").write_text("uncommitted\n")
        service.workspace_after_run(run=run1)
        ended(run1)

        second, run2 = admitted(issue)

        assert second.pk == first.pk
        path = Path(second.path)
        assert (path / "created.log").read_text() == "once\n"
        assert (path / "runs.log").read_text() == "run\nrun\n"
        assert (path / "work.txt").exists()
        assert len(hooks_of(second, "after_create")) == 1 and len(hooks_of(second, "before_run")) == 2
        assert ExecutionWorkspace.objects.count() == 1
        run2.refresh_from_db()
        assert run2.workspace_id == first.pk

    def test_a_deleted_folder_is_realized_again(self, root, project, new_issue, admitted):
        import shutil

        issue = new_issue(project=project)
        first, run1 = admitted(issue)
        ended(run1)
        shutil.rmtree(first.path)
        second, _ = admitted(issue)
        assert second.pk != first.pk and Path(second.path).is_dir()
        first.refresh_from_db()
        assert first.status == WorkspaceStatus.FAILED

    def test_agent_default_needs_a_repository(self, root, make_project, new_issue, admitted):
        no_repo = make_project(workspace_strategy=WorkspaceStrategy.AGENT_DEFAULT, repository="")
        issue = new_issue(project=no_repo)
        workspace, run = admitted(issue)
        assert workspace is None
        run.refresh_from_db()
        assert run.workspace_id is None
        assert admitted(new_issue())[0] is None  # no project at all

        with_repo = make_project(workspace_strategy=WorkspaceStrategy.AGENT_DEFAULT)
        workspace, _ = admitted(new_issue(project=with_repo))
        assert workspace.strategy == WorkspaceStrategy.ISOLATED

        isolated_no_repo = make_project(workspace_strategy=WorkspaceStrategy.ISOLATED, repository="")
        with pytest.raises(WorkspaceConfigError) as exc:
            admitted(new_issue(project=isolated_no_repo))
        assert exc.value.code == "workspace_repository_missing"


# --- shared folder and writer wait ----------------------------------------------------------------

class TestShared:
    def test_one_writer_at_a_time_and_an_ended_writer_is_replaced(self, root, repo, make_project, new_issue,
                                                                   new_run):
        project = make_project(workspace_strategy=WorkspaceStrategy.SHARED)
        a, b, c = new_issue(project=project), new_issue(project=project), new_issue(project=project)
        run_a, run_b, run_c = new_run(a), new_run(b), new_run(c)

        workspace = service.workspace_admit(issue=a, run=run_a)
        assert Path(workspace.path) == repo.resolve()
        assert workspace.strategy == WorkspaceStrategy.SHARED and workspace.writer_run_id == run_a.pk

        with pytest.raises(WorkspaceBusy) as exc:
            service.workspace_admit(issue=b, run=run_b)
        assert exc.value.code == "workspace_busy" and exc.value.status_code == 409
        assert exc.value.details["writerRunId"] == str(run_a.pk)
        run_b.refresh_from_db()
        assert run_b.workspace_id is None

        # The writer's run ended without after_run (a crash): the next writer replaces it.
        ended(run_a, "failed")
        again = service.workspace_admit(issue=b, run=run_b)
        assert again.pk == workspace.pk and again.writer_run_id == run_b.pk

        # A writer that finished cleanly releases the folder in after_run.
        service.workspace_after_run(run=run_b)
        assert service.workspace_admit(issue=c, run=run_c).writer_run_id == run_c.pk
        assert ExecutionWorkspace.objects.filter(strategy=WorkspaceStrategy.SHARED).count() == 1
        assert git("status", "--porcelain", cwd=repo) == ""  # the project folder was not modified

    def test_removing_a_shared_workspace_keeps_the_project_folder(self, root, repo, make_project, new_issue,
                                                                 admitted):
        project = make_project(workspace_strategy=WorkspaceStrategy.SHARED,
                               workspace_hooks={"before_remove": "touch removed-marker"})
        workspace, run = admitted(new_issue(project=project))
        service.workspace_after_run(run=run)
        ended(run)
        removed = service.workspace_remove(workspace=workspace)
        assert removed.status == WorkspaceStatus.REMOVED
        assert (repo / "README.md").exists() and not (repo / "removed-marker").exists()


# --- hooks ----------------------------------------------------------------------------------------

class TestHooks:
    def test_before_run_failure_aborts_and_changes_only_the_hook_log(self, root, make_project, new_issue, new_run):
        project = make_project(workspace_hooks={"before_run": "echo boom; exit 3"})
        issue = new_issue(project=project)
        run = new_run(issue)
        before = HeartbeatRun.objects.filter(pk=run.pk).values().get()

        with pytest.raises(HookFailed) as exc:
            service.workspace_admit(issue=issue, run=run)

        assert exc.value.code == "before_run_failed" and exc.value.details["exitCode"] == 3
        after = HeartbeatRun.objects.filter(pk=run.pk).values().get()
        assert after == before
        workspace = ExecutionWorkspace.objects.get()
        assert workspace.writer_run_id is None
        (entry,) = hooks_of(workspace, "before_run")
        assert entry["exitCode"] == 3 and "boom" in entry["output"] and entry["timedOut"] is False

    def test_after_create_failure_discards_the_new_workspace(self, root, repo, make_project, new_issue, new_run):
        project = make_project(workspace_hooks={"after_create": "exit 7"})
        issue = new_issue(project=project)
        with pytest.raises(HookFailed) as exc:
            service.workspace_admit(issue=issue, run=new_run(issue))
        assert exc.value.code == "after_create_failed"
        failed = ExecutionWorkspace.objects.get()
        assert failed.status == WorkspaceStatus.FAILED and not Path(failed.path).exists()
        assert not branch_exists(repo, failed.branch)
        issue.refresh_from_db()
        assert issue.execution_workspace_id is None

        project.workspace_hooks = {"after_create": "echo ok > ok.txt"}
        project.save()
        workspace = service.workspace_admit(issue=issue, run=new_run(issue))
        assert workspace.pk != failed.pk and (Path(workspace.path) / "ok.txt").exists()

    def test_after_run_failure_is_only_logged(self, root, make_project, new_issue, admitted):
        project = make_project(workspace_hooks={"after_run": "echo nope >&2; exit 4"})
        _, run = admitted(new_issue(project=project))
        result = service.workspace_after_run(run=run)
        (entry,) = hooks_of(result, "after_run")
        assert entry["exitCode"] == 4 and "nope" in entry["output"]
        assert result.writer_run_id is None and result.status == WorkspaceStatus.ACTIVE

    def test_before_remove_failure_is_only_logged_and_the_branch_is_kept(self, root, repo, make_project,
                                                                         new_issue, admitted):
        project = make_project(workspace_hooks={"before_remove": "exit 5"})
        workspace, run = admitted(new_issue(project=project))
        path = Path(workspace.path)
        commit_file(path, "done.txt", "done\n")
        service.workspace_after_run(run=run)
        ended(run)

        removed = service.workspace_remove(workspace=workspace)

        assert removed.status == WorkspaceStatus.REMOVED and removed.removed_at is not None
        assert not path.exists()
        assert branch_exists(repo, workspace.branch)
        assert str(path) not in git("worktree", "list", cwd=repo)
        (entry,) = hooks_of(removed, "before_remove")
        assert entry["exitCode"] == 5
        assert ActivityLog.objects.filter(action="workspace.removed", entity_id=str(workspace.pk)).exists()

    def test_hook_timeout_kills_the_process_group(self, root, make_project, new_issue, new_run):
        project = make_project(hook_timeout_seconds=1,
                               workspace_hooks={"before_run": "sleep 30 & echo $! > child.pid; sleep 5"})
        issue = new_issue(project=project)
        started = time.monotonic()
        with pytest.raises(HookFailed) as exc:
            service.workspace_admit(issue=issue, run=new_run(issue))
        assert time.monotonic() - started < 4
        assert exc.value.code == "before_run_failed" and exc.value.details["timedOut"] is True
        workspace = ExecutionWorkspace.objects.get()
        (entry,) = hooks_of(workspace, "before_run")
        assert entry["timedOut"] is True and entry["exitCode"] is None and 900 <= entry["durationMs"] < 4000
        child = int((Path(workspace.path) / "child.pid").read_text())
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and _alive(child):
            time.sleep(0.05)
        assert not _alive(child)

    def test_a_background_process_does_not_hold_the_hook(self, root, make_project, new_issue, new_run):
        project = make_project(hook_timeout_seconds=10, workspace_hooks={"before_run": "sleep 4 & echo bg"})
        issue = new_issue(project=project)
        started = time.monotonic()
        workspace = service.workspace_admit(issue=issue, run=new_run(issue))
        assert time.monotonic() - started < 3
        (entry,) = hooks_of(workspace, "before_run")
        assert entry["exitCode"] == 0 and entry["output"].strip() == "bg"

    def test_long_output_is_truncated_and_a_list_runs_as_one_script(self, root, make_project, new_issue,
                                                                    new_run):
        project = make_project(workspace_hooks={
            "after_create": "head -c 20000 /dev/zero | tr '\\0' a",
            "before_run": ["echo one > one.txt", "exit 2", "echo never > never.txt"]})
        issue = new_issue(project=project)
        with pytest.raises(HookFailed):
            service.workspace_admit(issue=issue, run=new_run(issue))
        workspace = ExecutionWorkspace.objects.get()
        (created,) = hooks_of(workspace, "after_create")
        assert created["outputTruncated"] is True and len(created["output"]) < 4200
        assert created["output"].startswith("aaa") and created["output"].endswith("aaa")
        (before,) = hooks_of(workspace, "before_run")
        assert before["exitCode"] == 2
        assert (Path(workspace.path) / "one.txt").exists() and not (Path(workspace.path) / "never.txt").exists()

    def test_remove_never_follows_a_swapped_in_symlink(self, root, tmp_path, make_project, new_issue,
                                                       admitted):
        import shutil

        project = make_project(workspace_hooks={"before_remove": "touch hook-ran"})
        workspace, run = admitted(new_issue(project=project))
        service.workspace_after_run(run=run)
        ended(run)
        precious = tmp_path / "precious"
        precious.mkdir()
        (precious / "keep.txt").write_text("keep\n")
        shutil.rmtree(workspace.path)
        Path(workspace.path).symlink_to(precious)

        removed = service.workspace_remove(workspace=workspace)

        assert removed.status == WorkspaceStatus.REMOVED
        assert not Path(workspace.path).is_symlink() and not Path(workspace.path).exists()
        assert (precious / "keep.txt").exists() and not (precious / "hook-ran").exists()

    def test_hook_environment_does_not_leak_server_secrets(self, root, make_project, new_issue, admitted,
                                                          monkeypatch):
        monkeypatch.setenv("DATABASE_URL", "postgres://secret@db/x")
        project = make_project(workspace_hooks={"before_run": "env > env.txt"})
        workspace, _ = admitted(new_issue(project=project))
        env = (Path(workspace.path) / "env.txt").read_text()
        assert "secret" not in env and "PAPERCLIP_ISSUE_IDENTIFIER=" in env


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# --- creation rules: a child task gets its own workspace ----------------------------------------------

class TestNewIssueFields:
    def test_child_takes_project_and_strategy_never_workspace_reuse_or_branch(self, root, project, new_issue,
                                                                              admitted):
        parent = new_issue(project=project, workspace_strategy=WorkspaceStrategy.ISOLATED)
        parent_ws, _ = admitted(parent)
        Issue.objects.filter(pk=parent.pk).update(workspace_reuse_existing=True, workspace_branch="pinned/parent")
        parent.refresh_from_db()

        fields = service.new_issue_workspace_fields(parent=parent, inherit_from=None)

        assert fields == {"project_id": project.pk, "workspace_strategy": WorkspaceStrategy.ISOLATED,
                          "execution_workspace_id": None, "workspace_reuse_existing": False,
                          "workspace_branch": ""}
        assert parent_ws.pk != fields["execution_workspace_id"]

    def test_explicit_ancestor_workspace_ids_are_dropped(self, root, project, new_issue, admitted):
        grandparent = new_issue(project=project)
        grandparent_ws, _ = admitted(grandparent)
        parent = new_issue(project=project, parent=grandparent)
        parent_ws, _ = admitted(parent)

        for requested in (parent_ws.pk, str(grandparent_ws.pk)):
            fields = service.new_issue_workspace_fields(parent=parent, inherit_from=None,
                                                        requested_workspace_id=requested)
            assert fields["execution_workspace_id"] is None and fields["workspace_reuse_existing"] is False
            assert fields["workspace_strategy"] == WorkspaceStrategy.ISOLATED  # only the strategy is kept

        # "Bound to" counts too: the parent shares an unrelated task's workspace.
        other_ws, _ = admitted(new_issue(project=project))
        bound_parent = new_issue(project=project, execution_workspace=other_ws, workspace_reuse_existing=True)
        fields = service.new_issue_workspace_fields(parent=bound_parent, inherit_from=None,
                                                    requested_workspace_id=other_ws.pk)
        assert fields["execution_workspace_id"] is None

    def test_an_unrelated_explicit_workspace_is_kept_and_shared(self, root, project, new_issue, new_run, admitted):
        other = new_issue(project=project)
        other_ws, other_run = admitted(other)
        parent = new_issue(project=project)

        fields = service.new_issue_workspace_fields(parent=parent, inherit_from=None,
                                                    requested_workspace_id=other_ws.pk, project=project)
        assert fields["execution_workspace_id"] == other_ws.pk and fields["workspace_reuse_existing"] is True

        follower = new_issue(parent=parent, **fields)
        run = new_run(follower)
        with pytest.raises(WorkspaceBusy):  # an explicit share still waits for the other writer
            service.workspace_admit(issue=follower, run=run)
        service.workspace_after_run(run=other_run)
        assert service.workspace_admit(issue=follower, run=run).pk == other_ws.pk
        follower.refresh_from_db()
        assert follower.execution_workspace_id == other_ws.pk  # not re-bound: not an ancestor's

    def test_unknown_or_foreign_workspace_is_not_found(self, root, project, new_issue, admitted):
        foreign_company = CompanyFactory(issue_prefix="FX")
        foreign_project = ProjectFactory(company=foreign_company, workspace_strategy=WorkspaceStrategy.ISOLATED,
                                         repository=project.repository, base_ref="main")
        foreign = IssueFactory(company=foreign_company, project=foreign_project, status="todo")
        foreign_ws, _ = admitted(foreign)
        with pytest.raises(NotFound):
            service.new_issue_workspace_fields(parent=None, inherit_from=None, project=project,
                                               requested_workspace_id=foreign_ws.pk)
        with pytest.raises(NotFound):
            service.new_issue_workspace_fields(parent=None, inherit_from=None, project=project,
                                               requested_workspace_id="not-a-uuid")

    def test_inherit_from_copies_only_project_and_strategy(self, root, project, make_project, new_issue,
                                                           admitted):
        source = new_issue(project=project, workspace_strategy=WorkspaceStrategy.SHARED)
        other_ws, _ = admitted(new_issue(project=project))
        Issue.objects.filter(pk=source.pk).update(execution_workspace=other_ws, workspace_reuse_existing=True,
                                                  workspace_branch="feature/source")
        source.refresh_from_db()

        fields = service.new_issue_workspace_fields(parent=None, inherit_from=source)
        assert fields == {"project_id": project.pk, "workspace_strategy": WorkspaceStrategy.SHARED,
                          "execution_workspace_id": None, "workspace_reuse_existing": False,
                          "workspace_branch": ""}

        # inherit_from wins over the parent as the source of project and strategy.
        parent = new_issue(project=make_project(), workspace_strategy=WorkspaceStrategy.ISOLATED)
        assert service.new_issue_workspace_fields(parent=parent, inherit_from=source)["workspace_strategy"] == \
            WorkspaceStrategy.SHARED

        # In another project the source's strategy does not apply; nor from a project with no repository.
        elsewhere = make_project()
        assert service.new_issue_workspace_fields(parent=None, inherit_from=source,
                                                  project=elsewhere)["workspace_strategy"] == ""
        no_repo = make_project(repository="", workspace_strategy=WorkspaceStrategy.AGENT_DEFAULT)
        repo_less = new_issue(project=no_repo, workspace_strategy=WorkspaceStrategy.ISOLATED)
        fields = service.new_issue_workspace_fields(parent=repo_less, inherit_from=None)
        assert fields["project_id"] == no_repo.pk and fields["workspace_strategy"] == ""

    def test_a_requested_strategy_wins_and_is_validated(self, project, new_issue):
        parent = new_issue(project=project, workspace_strategy=WorkspaceStrategy.ISOLATED)
        fields = service.new_issue_workspace_fields(parent=parent, inherit_from=None,
                                                    requested_strategy=WorkspaceStrategy.SHARED)
        assert fields["workspace_strategy"] == WorkspaceStrategy.SHARED
        with pytest.raises(Exception) as exc:
            service.new_issue_workspace_fields(parent=parent, inherit_from=None, requested_strategy="bogus")
        assert exc.value.code == "validation_error"


# --- admission: independence and the upgrade-safe rebind ------------------------------------------------

class TestAdmission:
    def test_parent_and_child_get_independent_worktrees(self, root, repo, project, new_issue, new_run):
        parent = new_issue(project=project, workspace_strategy=WorkspaceStrategy.ISOLATED)
        parent_run = new_run(parent)
        parent_ws = service.workspace_admit(issue=parent, run=parent_run)
        (Path(parent_ws.path) / "parent-draft.txt").write_text("unmerged\n")

        child = new_issue(parent=parent, **service.new_issue_workspace_fields(
            parent=parent, inherit_from=None, requested_workspace_id=parent_ws.pk))
        child_run = new_run(child)
        child_ws = service.workspace_admit(issue=child, run=child_run)  # parent still running: no workspace_busy

        assert child_ws.pk != parent_ws.pk and child_ws.source_issue_id == child.pk
        assert child_ws.path != parent_ws.path and child_ws.branch == f"paperclip/{child.identifier}"
        assert child_ws.branch != parent_ws.branch
        assert not (Path(child_ws.path) / "parent-draft.txt").exists()
        assert (Path(parent_ws.path) / "parent-draft.txt").exists()
        assert git("rev-parse", "--abbrev-ref", "HEAD", cwd=parent_ws.path) == parent_ws.branch
        parent.refresh_from_db()
        parent_ws.refresh_from_db()
        assert parent.execution_workspace_id == parent_ws.pk and parent_ws.writer_run_id == parent_run.pk

    def _old_release_child(self, new_issue, parent, parent_ws, **kwargs):
        """The shape an older release created: the child bound to its parent's workspace."""
        return new_issue(project=parent.project, parent=parent, execution_workspace=parent_ws,
                         workspace_reuse_existing=True, workspace_branch=parent_ws.branch, **kwargs)

    def test_old_child_bound_to_the_parent_workspace_is_rebound_at_admission(self, root, project, new_issue,
                                                                            new_run):
        parent = new_issue(project=project)
        parent_run = new_run(parent)
        parent_ws = service.workspace_admit(issue=parent, run=parent_run)
        child = self._old_release_child(new_issue, parent, parent_ws)
        parent_before = Issue.objects.filter(pk=parent.pk).values().get()
        parent_ws_before = ExecutionWorkspace.objects.filter(pk=parent_ws.pk).values().get()

        child_run = new_run(child)
        child_ws = service.workspace_admit(issue=child, run=child_run)  # no workspace_busy

        assert child_ws.pk != parent_ws.pk and child_ws.source_issue_id == child.pk
        assert child_ws.branch == f"paperclip/{child.identifier}"
        child.refresh_from_db()
        assert child.execution_workspace_id == child_ws.pk
        assert child.workspace_reuse_existing is False and child.workspace_branch == ""
        # The parent, its workspace row and folder are untouched.
        assert Issue.objects.filter(pk=parent.pk).values().get() == parent_before
        assert ExecutionWorkspace.objects.filter(pk=parent_ws.pk).values().get() == parent_ws_before
        assert Path(parent_ws.path).is_dir()
        assert ActivityLog.objects.filter(action="issue.workspace_rebound", entity_id=str(child.pk)).exists()

    def test_no_rebind_while_the_child_has_another_live_run(self, root, project, new_issue, new_run):
        parent = new_issue(project=project)
        parent_run = new_run(parent)
        parent_ws = service.workspace_admit(issue=parent, run=parent_run)
        service.workspace_after_run(run=parent_run)
        ended(parent_run)
        child = self._old_release_child(new_issue, parent, parent_ws)
        in_flight = new_run(child)  # deployed mid-run: this run keeps writing in the shared folder

        second = new_run(child)
        workspace = service.workspace_admit(issue=child, run=second)
        assert workspace.pk == parent_ws.pk
        child.refresh_from_db()
        assert child.execution_workspace_id == parent_ws.pk and child.workspace_reuse_existing is True

        # Once nothing of the child is live, its next normal admission moves it.
        service.workspace_after_run(run=second)
        ended(second)
        ended(in_flight)
        own = service.workspace_admit(issue=child, run=new_run(child))
        assert own.pk != parent_ws.pk and own.source_issue_id == child.pk
        parent.refresh_from_db()
        assert parent.execution_workspace_id == parent_ws.pk

    def test_a_retry_that_keeps_its_workspace_is_not_rebound(self, root, project, new_issue, new_run):
        parent = new_issue(project=project)
        parent_run = new_run(parent)
        parent_ws = service.workspace_admit(issue=parent, run=parent_run)
        service.workspace_after_run(run=parent_run)
        child = self._old_release_child(new_issue, parent, parent_ws)
        first = ended(new_run(child, workspace=parent_ws), "failed")
        retry = new_run(child, source_run=first, retry_attempt=1)
        assert service.workspace_admit(issue=child, run=retry).pk == parent_ws.pk

    def test_a_task_placed_beside_its_requester_is_rebound_from_the_requester(self, root, project, new_issue,
                                                                             new_run):
        top = new_issue(project=project)
        requester = new_issue(project=project, parent=top)
        requester_run = new_run(requester)
        requester_ws = service.workspace_admit(issue=requester, run=requester_run)
        flattened = new_issue(project=project, parent=top, origin_issue=requester, execution_workspace=requester_ws,
                              workspace_reuse_existing=True)
        workspace = service.workspace_admit(issue=flattened, run=new_run(flattened))
        assert workspace.pk != requester_ws.pk
        requester.refresh_from_db()
        assert requester.execution_workspace_id == requester_ws.pk

    def test_the_parent_is_never_rebound(self, root, project, new_issue, new_run):
        parent = new_issue(project=project)
        run1 = new_run(parent)
        parent_ws = service.workspace_admit(issue=parent, run=run1)
        child = self._old_release_child(new_issue, parent, parent_ws)
        service.workspace_after_run(run=run1)
        ended(run1)
        # The child's run is live, and the parent is admitted again: same workspace.
        new_run(child)
        assert service.workspace_admit(issue=parent, run=new_run(parent)).pk == parent_ws.pk
        assert ExecutionWorkspace.objects.filter(status=WorkspaceStatus.ACTIVE).count() == 1


# --- retention and disk usage ---------------------------------------------------------------------------

class TestRetention:
    def test_removed_after_the_delay_only_for_terminal_issues(self, root, project, new_issue, admitted):
        done = new_issue(project=project)
        done_ws, done_run = admitted(done)
        cancelled = new_issue(project=project)
        cancelled_ws, cancelled_run = admitted(cancelled)
        open_issue = new_issue(project=project)
        open_ws, open_run = admitted(open_issue)
        for run in (done_run, cancelled_run, open_run):
            service.workspace_after_run(run=run)
            ended(run)
        now = timezone.now()
        Issue.objects.filter(pk=done.pk).update(status="done", completed_at=now)
        Issue.objects.filter(pk=cancelled.pk).update(status="cancelled", cancelled_at=now + timedelta(minutes=30))

        with time_machine.travel(now + timedelta(minutes=59), tick=False):
            report = service.workspace_retention_sweep()
        assert report["removed"] == 0 and report["not_due"] == 3

        with time_machine.travel(now + timedelta(minutes=61), tick=False):
            report = service.workspace_retention_sweep()
        assert report["removed"] == 1
        done_ws.refresh_from_db()
        assert done_ws.status == WorkspaceStatus.REMOVED and not Path(done_ws.path).exists()

        with time_machine.travel(now + timedelta(days=30), tick=False):
            report = service.workspace_retention_sweep()
        assert report["removed"] == 1
        cancelled_ws.refresh_from_db()
        open_ws.refresh_from_db()
        assert cancelled_ws.status == WorkspaceStatus.REMOVED
        assert open_ws.status == WorkspaceStatus.ACTIVE and Path(open_ws.path).is_dir()

    def test_never_removed_with_a_live_run(self, root, project, new_issue, admitted, new_run):
        issue = new_issue(project=project)
        workspace, run = admitted(issue)  # the run is still live
        now = timezone.now()
        Issue.objects.filter(pk=issue.pk).update(status="done", completed_at=now)
        with time_machine.travel(now + timedelta(days=2), tick=False):
            report = service.workspace_retention_sweep()
            assert report["kept_live"] == 1 and report["removed"] == 0
            with pytest.raises(WorkspaceBusy):
                service.workspace_remove(workspace=workspace)
            assert Path(workspace.path).is_dir()
            ended(run)
            assert service.workspace_retention_sweep()["removed"] == 1

    def test_kept_while_another_bound_issue_is_open(self, root, project, new_issue, admitted):
        source = new_issue(project=project)
        workspace, run = admitted(source)
        service.workspace_after_run(run=run)
        ended(run)
        new_issue(project=project, execution_workspace=workspace, workspace_reuse_existing=True)
        now = timezone.now()
        Issue.objects.filter(pk=source.pk).update(status="done", completed_at=now)
        with time_machine.travel(now + timedelta(days=2), tick=False):
            assert service.workspace_retention_sweep()["removed"] == 0
        workspace.refresh_from_db()
        assert workspace.status == WorkspaceStatus.ACTIVE

    def test_disk_usage_and_cap_in_health(self, root, settings, project, new_issue, admitted):
        workspace, _ = admitted(new_issue(project=project))
        (Path(workspace.path) / "blob.bin").write_bytes(b"\0" * 200_000)
        os.link(Path(workspace.path) / "blob.bin", Path(workspace.path) / "hardlink.bin")

        report = service.workspace_retention_sweep()
        assert 200_000 <= report["disk_bytes"] < 400_000  # a hard link counts once
        assert report["over_cap"] is False and report["disk_cap_bytes"] == 10**12

        settings.PAPERCLIP = {**settings.PAPERCLIP, "WORKSPACE_DISK_CAP_BYTES": 100_000}
        health = service.workspace_health()
        assert health["over_cap"] is True and health["disk_cap_bytes"] == 100_000
        assert health["active_workspaces"] == 1 and health["root"] == str(root.resolve())
