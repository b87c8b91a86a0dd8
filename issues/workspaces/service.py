"""Execution workspaces: realize at run admission, lifecycle hooks, removal and retention.

Rules (seed 000 first section and §9.4, seed 003 hooks, Symphony §9):

- A task gets its own workspace. A new issue may take its project and *strategy* from its parent
  or from ``inheritExecutionWorkspaceFromIssueId``, never a workspace id, the ``reuse_existing``
  preference or a pinned branch (:func:`new_issue_workspace_fields`).
- At admission (:func:`workspace_admit`) an issue that an older release bound to an ancestor's
  workspace is re-bound first (unless another of its runs is live), then the workspace is realized:
  ``isolated`` → a git worktree on the issue's own branch under ``WORKSPACE_ROOT``; ``shared`` →
  the project folder with one writer at a time (``workspace_busy``).
- Hooks: ``after_create`` (new workspace only) and ``before_run`` are fatal; ``after_run`` and
  ``before_remove`` are logged only. Commands and the timeout come from the run policy
  (issues.services.run_policy: the project's own hooks and ``hook_timeout_seconds``, then the
  workflow document's ``hooks.*`` and ``hooks.timeout_ms``, then the default). A document hook the
  run policy leaves out (an https repository's WORKFLOW.md, connector defaults: not staff-set) is
  not run, and the run's log says why.
- An https repository is cloned and fetched through the outbound guard, checked at each use
  (:func:`gitops.guarded_options`); a refused one fails admission naming the repository.

No DB transaction is held while git or a hook runs: every DB write is a short ``atomic`` block
before or after the filesystem work. Git work on one repository is serialized on this host by a
file lock under ``<root>/.locks``.
"""
from __future__ import annotations

import logging
import os
import shutil
import stat
import string
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from issues.actors import SYSTEM
from issues.choices import (
    LIVE_RUN_STATUSES,
    TERMINAL_ISSUE_STATUSES,
    IssueStatus,
    WorkspaceStatus,
    WorkspaceStrategy,
)
from issues.exceptions import ApiError, InvalidInput, NotFound
from issues.models import ExecutionWorkspace, HeartbeatRun, Issue, Project
from issues.selectors import walk_up
from issues.services.activity import activity_record

from . import gitops
from .errors import HookFailed, WorkspaceBusy, WorkspaceConfigError, WorkspacePathEscape
from .hooks import HookResult, hook_command, run_hook
from .keys import workspace_key
from .paths import safe_path

logger = logging.getLogger("paperclip.workspaces")

HOOK_LOG_LIMIT = 50  # newest entries kept in ExecutionWorkspace.hook_log
DEFAULT_HOOK_TIMEOUT = 120
DEFAULT_BRANCH_TEMPLATE = "paperclip/{identifier}"
REPO_CACHE_DIR = ".repos"  # clones of URL repositories (names never clash with issue keys)
LOCK_DIR = ".locks"

__all__ = [
    "new_issue_workspace_fields",
    "workspace_admit",
    "workspace_after_run",
    "workspace_disk_usage",
    "workspace_health",
    "workspace_remove",
    "workspace_retention_sweep",
    "workspace_root",
]


# --- settings and paths ---------------------------------------------------------------------

def workspace_root() -> Path:
    """The configured root, created if missing and resolved (symlinks followed)."""
    root = Path(os.path.abspath(os.path.expanduser(str(settings.PAPERCLIP["WORKSPACE_ROOT"]))))
    root.mkdir(parents=True, exist_ok=True)
    return root.resolve()


def _lock_path(root: Path, kind: str, name: str) -> Path:
    return root / LOCK_DIR / f"{kind}-{workspace_key(name)}.lock"


def _repository_dir(project: Project, root: Path, *, require_git: bool) -> Path:
    """The local folder of the project's repository; a URL is cloned once per company under
    ``<root>/.repos/<company id>``: companies sharing a URL never see each other's branches and commits
    (a base ref or branch template naming another company's branch finds nothing)."""
    repository = (project.repository or "").strip()
    if not repository:
        raise WorkspaceConfigError("The project has no repository.", code="workspace_repository_missing",
                                   details={"projectId": str(project.pk)})
    if gitops.is_url(repository):
        cache = safe_path(root, REPO_CACHE_DIR, str(project.company_id), workspace_key(repository))
        with gitops.file_lock(_lock_path(root, "repo", str(cache))):
            if not (cache.is_dir() and gitops.is_work_tree(cache)):
                if cache.exists():
                    shutil.rmtree(cache)  # a clone that failed half way
                cache.parent.mkdir(parents=True, exist_ok=True)
                gitops.git("clone", "--quiet", repository, str(cache), guarded=_guarded(repository))
        return cache
    path = Path(os.path.expanduser(repository))
    if not path.is_absolute():
        raise WorkspaceConfigError("The project repository must be an absolute path or a URL.",
                                   code="workspace_repository_invalid", details={"repository": repository})
    path = path.resolve()
    if not path.is_dir():
        raise WorkspaceConfigError("The project repository folder does not exist.",
                                   code="workspace_repository_missing", details={"repository": repository})
    if require_git and not gitops.is_work_tree(path) and gitops.common_git_dir(path) is None:
        raise WorkspaceConfigError("The project repository is not a git repository.",
                                   code="workspace_repository_invalid", details={"repository": repository})
    return path


def _guarded(repository: str) -> list[str] | None:
    """git options for a remote an https URL names (checked now, at use: the address may have moved
    since it was written); None for staff-set folders, file:// and ssh URLs."""
    if not gitops.is_http_url(repository):
        return None
    from issues.services.projects import redact_url

    return gitops.guarded_options(repository, label=redact_url(repository))


def _lexically_inside(path: str | Path, root: Path) -> Path:
    """``path`` as written (symlinks not followed) strictly inside ``root``."""
    lexical = Path(os.path.abspath(path))
    if lexical == root or not lexical.is_relative_to(root):
        raise WorkspacePathEscape(details={"root": str(root), "path": str(path)})
    return lexical


def _inside_root(path: str | Path, root: Path) -> Path:
    """``path`` checked to be strictly inside ``root`` (symlinks resolved)."""
    return safe_path(root, *_lexically_inside(path, root).relative_to(root).parts)


# --- lineage ------------------------------------------------------------------------------------

def _chain_ids(*nodes: Issue | None) -> set:
    """Each node and its parent chain."""
    ids = set()
    for node in nodes:
        if node is not None:
            ids.add(node.pk)
            ids.update(a.pk for a in walk_up(node))
    return ids


def _issue_lineage_ids(issue: Issue) -> set:
    """The ancestors of an existing issue: its parent chain, plus its requester's chain when depth
    placement put it beside the requester (seed 004: same parent as its ``origin_issue``)."""
    ids = {a.pk for a in walk_up(issue)}
    if issue.parent_id and issue.origin_issue_id and issue.origin_issue_id != issue.pk:
        origin = issue.origin_issue
        if origin is not None and origin.parent_id == issue.parent_id:
            ids |= _chain_ids(origin)
    ids.discard(issue.pk)
    return ids


def _is_ancestor_workspace(workspace: ExecutionWorkspace, lineage: set) -> bool:
    """The workspace was created by, or is bound to, an issue of the lineage."""
    if not lineage:
        return False
    if workspace.source_issue_id in lineage:
        return True
    return Issue.objects.filter(pk__in=lineage, execution_workspace_id=workspace.pk).exists()


# --- creation-time fields --------------------------------------------------------------------

def new_issue_workspace_fields(
    *,
    parent: Issue | None,
    inherit_from: Issue | None,
    requested_workspace_id=None,
    requested_strategy: str | None = None,
    project: Project | None = None,
    requester: Issue | None = None,
    company=None,
) -> dict:
    """The workspace fields a NEW issue gets (for ``Issue(**fields)``).

    ``inherit_from`` (``inheritExecutionWorkspaceFromIssueId``), else ``parent``, may supply the
    project and the strategy (the strategy only when the new issue stays in the source's project and
    that project has a repository). Their workspace id, ``reuse_existing`` flag and pinned branch are
    never copied. A ``requested_workspace_id`` that the parent chain (or ``requester``'s chain, for a
    task placed beside its requester) created or is bound to is dropped silently; any other existing
    workspace of the company is kept as an explicit share (``reuse_existing=True``).
    """
    if requested_strategy and requested_strategy not in WorkspaceStrategy.values:
        raise InvalidInput(details={"workspaceStrategy": [
            f"'{requested_strategy}' is not one of {', '.join(WorkspaceStrategy.values)}."]})
    source = inherit_from or parent
    project_id = project.pk if project is not None else (source.project_id if source is not None else None)
    company_id = getattr(company, "pk", company) or next(
        (o.company_id for o in (project, parent, inherit_from) if o is not None), None)

    strategy = requested_strategy or ""
    if not strategy and source is not None and source.workspace_strategy and project_id is not None \
            and source.project_id == project_id and _project_has_repository(project_id):
        strategy = source.workspace_strategy

    fields = {"project_id": project_id, "workspace_strategy": strategy, "execution_workspace_id": None,
              "workspace_reuse_existing": False, "workspace_branch": ""}
    if requested_workspace_id in (None, ""):
        return fields

    filters = {"pk": requested_workspace_id}
    if company_id is not None:
        filters["company_id"] = company_id
    try:
        workspace = ExecutionWorkspace.objects.filter(**filters).first()
    except (ValueError, TypeError, DjangoValidationError):  # malformed id
        workspace = None
    if workspace is None:
        raise NotFound("Execution workspace not found.", details={"executionWorkspaceId": ["Not found."]})
    if _is_ancestor_workspace(workspace, _chain_ids(parent, requester)):
        # An older client copied its parent's workspace: the task gets its own (seed 000).
        if not fields["workspace_strategy"] and workspace.project_id == project_id \
                and workspace.strategy in WorkspaceStrategy.values:
            fields["workspace_strategy"] = workspace.strategy
        return fields
    if workspace.status != WorkspaceStatus.ACTIVE:
        raise InvalidInput("The execution workspace is no longer active.", code="workspace_not_active",
                           details={"executionWorkspaceId": [f"Workspace is {workspace.status}."]})
    fields["execution_workspace_id"] = workspace.pk
    fields["workspace_reuse_existing"] = True
    return fields


def _project_has_repository(project_id) -> bool:
    return Project.objects.filter(pk=project_id).exclude(repository="").exists()


# --- admission ----------------------------------------------------------------------------------

@dataclass
class _Realized:
    workspace: ExecutionWorkspace
    created: bool
    created_branch: bool = False


def workspace_admit(*, issue: Issue, run: HeartbeatRun) -> ExecutionWorkspace | None:
    """Realize ``issue``'s workspace for the admitted ``run`` and run its hooks.

    Returns the workspace (also set as ``run.workspace`` and ``issue.execution_workspace``), or
    ``None`` when the issue needs none (``agent_default`` without a repository, no project).
    Raises :class:`WorkspaceBusy` while another live run writes there, :class:`HookFailed` when
    ``after_create``/``before_run`` fail (the run is left unchanged), and configuration or git errors.
    """
    issue.refresh_from_db()
    _release_ancestor_binding(issue=issue, run=run)
    root = workspace_root()

    for _attempt in range(3):
        realized = _bound_workspace(issue=issue)
        if realized is None:
            realized = _realize(issue=issue, root=root)
            if realized is None:
                return None
        if _claim_writer(workspace=realized.workspace, run=run):
            break
        # Removed between the lookup and the claim: realize again.
        _unbind(issue=issue, workspace=realized.workspace)
    else:  # pragma: no cover - a removal racing every attempt
        raise WorkspaceBusy("The workspace is being removed.", details={"issueId": str(issue.pk)})

    workspace = realized.workspace
    try:
        if realized.created:
            result = _hook(workspace, "after_create", issue=issue, run=run)
            if result is not None and not result.ok:
                _discard_new(realized=realized, issue=issue, run=run)
                raise HookFailed("The after_create hook failed.", code="after_create_failed",
                                 details=_hook_details(result, workspace))
        result = _hook(workspace, "before_run", issue=issue, run=run)
        if result is not None and not result.ok:
            raise HookFailed("The before_run hook failed; the run was not started.", code="before_run_failed",
                             details=_hook_details(result, workspace))
    except BaseException:
        _release_writer(workspace=workspace, run=run)
        raise

    now = timezone.now()
    with transaction.atomic():
        ExecutionWorkspace.objects.filter(pk=workspace.pk).update(last_used_at=now, updated_at=now)
        HeartbeatRun.objects.filter(pk=run.pk).update(workspace=workspace, updated_at=now)
        Issue.objects.filter(pk=issue.pk).update(execution_workspace=workspace, updated_at=now)
    workspace.refresh_from_db()
    run.workspace = workspace
    issue.execution_workspace = workspace
    return workspace


def _hook_details(result: HookResult, workspace: ExecutionWorkspace) -> dict:
    return {"workspaceId": str(workspace.pk), "hook": result.hook, "exitCode": result.exit_code,
            "timedOut": result.timed_out, "output": result.output[-1000:]}


def _keeps_current_workspace(run: HeartbeatRun, workspace: ExecutionWorkspace) -> bool:
    """A retry/continuation whose chain started in this workspace, or a run that asks to keep it,
    finishes where it started (seed 000: in-flight writers finish first)."""
    if (run.context or {}).get("keepWorkspace") is True:
        return True
    return bool(run.source_run_id) and HeartbeatRun.objects.filter(
        pk=run.source_run_id, workspace_id=workspace.pk).exists()


def _release_ancestor_binding(*, issue: Issue, run: HeartbeatRun) -> bool:
    """Upgrade-safe rebind: clear a binding an older release copied from an ancestor.

    Only the issue's own row changes; the ancestor, its workspace row, folder and branch are never
    touched. Nothing happens while another run of the issue is live.
    """
    if not issue.execution_workspace_id:
        return False
    workspace = ExecutionWorkspace.objects.filter(pk=issue.execution_workspace_id).first()
    if workspace is None or workspace.source_issue_id == issue.pk:
        return False
    if not _is_ancestor_workspace(workspace, _issue_lineage_ids(issue)):
        return False  # an explicit share with an unrelated task stays
    if _keeps_current_workspace(run, workspace):
        return False
    with transaction.atomic():
        locked = Issue.objects.select_for_update().get(pk=issue.pk)
        if locked.execution_workspace_id != workspace.pk:
            return False
        if HeartbeatRun.objects.filter(issue_id=issue.pk, status__in=LIVE_RUN_STATUSES).exclude(pk=run.pk).exists():
            return False
        locked.execution_workspace = None
        locked.workspace_reuse_existing = False
        if locked.workspace_branch and locked.workspace_branch == workspace.branch:
            locked.workspace_branch = ""  # the ancestor's branch is checked out in its worktree
        locked.save(update_fields=["execution_workspace", "workspace_reuse_existing", "workspace_branch",
                                   "updated_at"])
        activity_record(actor=SYSTEM, company_id=issue.company_id, action="issue.workspace_rebound",
                        entity_type="issue", entity_id=issue.pk, run=run,
                        details={"releasedWorkspaceId": str(workspace.pk),
                                 "workspaceSourceIssueId": str(workspace.source_issue_id)
                                 if workspace.source_issue_id else None})
    issue.refresh_from_db()
    return True


def _bound_workspace(*, issue: Issue) -> _Realized | None:
    """The issue's bound workspace when it is active and its folder exists; else unbind it."""
    if not issue.execution_workspace_id:
        return None
    workspace = ExecutionWorkspace.objects.select_related("project").filter(pk=issue.execution_workspace_id).first()
    if workspace is not None and workspace.status == WorkspaceStatus.ACTIVE:
        if Path(workspace.path).is_dir():
            return _Realized(workspace, created=False)
        if workspace.strategy == WorkspaceStrategy.SHARED:
            raise WorkspaceConfigError("The shared workspace folder does not exist.",
                                       code="workspace_repository_missing", details={"path": workspace.path})
        _mark_status(workspace=workspace, status=WorkspaceStatus.FAILED, note="folder missing at admission")
    _unbind(issue=issue, workspace=workspace)
    return None


def _unbind(*, issue: Issue, workspace: ExecutionWorkspace | None):
    with transaction.atomic():
        Issue.objects.filter(pk=issue.pk, execution_workspace_id=getattr(workspace, "pk", None)).update(
            execution_workspace=None, updated_at=timezone.now())
    issue.refresh_from_db()


def _resolved_strategy(issue: Issue) -> tuple[str, Project] | None:
    project = issue.project
    strategy = issue.workspace_strategy or (project.workspace_strategy if project is not None else "")
    has_repository = project is not None and bool((project.repository or "").strip())
    if not strategy:
        return None
    if strategy == WorkspaceStrategy.AGENT_DEFAULT:
        return (WorkspaceStrategy.ISOLATED, project) if has_repository else None
    if not has_repository:
        raise WorkspaceConfigError(f"A {strategy} needs a project with a repository.",
                                   code="workspace_repository_missing", details={"issueId": str(issue.pk)})
    return strategy, project


def _realize(*, issue: Issue, root: Path) -> _Realized | None:
    resolved = _resolved_strategy(issue)
    if resolved is None:
        return None
    strategy, project = resolved
    if strategy == WorkspaceStrategy.SHARED:
        return _realize_shared(issue=issue, project=project, root=root)
    return _realize_isolated(issue=issue, project=project, root=root)


def _realize_shared(*, issue: Issue, project: Project, root: Path) -> _Realized:
    folder = _repository_dir(project, root, require_git=False)
    key = workspace_key(f"project-{project.pk}")
    created = False
    with transaction.atomic():
        workspace = (ExecutionWorkspace.objects.select_for_update()
                     .filter(company_id=project.company_id, key=key, status=WorkspaceStatus.ACTIVE).first())
        if workspace is None:
            try:
                with transaction.atomic():
                    workspace = ExecutionWorkspace.objects.create(
                        company_id=project.company_id, project=project, source_issue=None,
                        strategy=WorkspaceStrategy.SHARED, key=key, path=str(folder),
                        base_ref=project.base_ref, status=WorkspaceStatus.ACTIVE)
                created = True
            except IntegrityError:  # a concurrent admission created it
                workspace = ExecutionWorkspace.objects.get(company_id=project.company_id, key=key,
                                                           status=WorkspaceStatus.ACTIVE)
        Issue.objects.filter(pk=issue.pk).update(execution_workspace=workspace, updated_at=timezone.now())
    workspace.project = project
    return _Realized(workspace, created=created)


def _branch_name(project: Project, issue: Issue, key: str) -> str:
    if issue.workspace_branch:
        name = issue.workspace_branch
    else:
        template = project.branch_template or DEFAULT_BRANCH_TEMPLATE
        values = {"identifier": issue.identifier, "key": key, "number": issue.number, "issue_id": str(issue.pk)}
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
        except ValueError as exc:
            raise WorkspaceConfigError(code="branch_template_invalid", details={"branchTemplate": str(exc)}) from exc
        unknown = [f for f in fields if f not in values]
        if unknown:
            raise WorkspaceConfigError(code="branch_template_invalid",
                                       details={"branchTemplate": f"unknown placeholder(s): {', '.join(unknown)}",
                                                "allowed": sorted(values)})
        name = template.format_map(values)
    if not gitops.valid_branch_name(name):
        raise WorkspaceConfigError(code="branch_name_invalid", details={"branch": name})
    return name


def _start_point(repo: Path, base_ref: str, repository: str = "") -> str:
    """Where a new branch starts: ``origin/<base_ref>`` fetched fresh when an origin exists (the clone
    of an https ``repository`` fetches through the guard)."""
    base_ref = (base_ref or "").strip()
    if gitops.has_remote(repo, "origin"):
        gitops.git("fetch", "--quiet", "--prune", "origin", cwd=repo, guarded=_guarded(repository))
        if not base_ref:
            head = gitops.git("symbolic-ref", "--quiet", "--short", "refs/remotes/origin/HEAD", cwd=repo, check=False)
            if head.returncode == 0 and head.stdout.strip():
                return head.stdout.strip()
            base_ref = gitops.current_branch(repo)
        if base_ref and gitops.ref_exists(repo, f"refs/remotes/origin/{base_ref}"):
            return f"origin/{base_ref}"
    start = base_ref or "HEAD"
    if not gitops.ref_exists(repo, start):
        raise WorkspaceConfigError("The base ref does not exist in the repository.", code="base_ref_missing",
                                   details={"baseRef": start})
    return start


def _clear_stale_path(path: Path, repo: Path):
    """A folder at the key's path with no active workspace row is left from a crashed admission."""
    if path.exists():
        listed = gitops.git("worktree", "list", "--porcelain", cwd=repo, check=False).stdout
        if f"worktree {path}" in listed.splitlines():
            gitops.git("worktree", "remove", "--force", "--force", str(path), cwd=repo, check=False)
        if path.exists():
            shutil.rmtree(path)
    gitops.git("worktree", "prune", cwd=repo, check=False)


def _realize_isolated(*, issue: Issue, project: Project, root: Path) -> _Realized:
    key = workspace_key(issue.identifier)
    if (root / key).is_symlink():
        raise WorkspacePathEscape("The workspace path is a symlink.", details={"path": str(root / key)})
    path = safe_path(root, key)
    repo = _repository_dir(project, root, require_git=True)
    branch = _branch_name(project, issue, key)
    with gitops.file_lock(_lock_path(root, "repo", str(repo))):
        existing = (ExecutionWorkspace.objects.select_related("project")
                    .filter(company_id=issue.company_id, key=key, status=WorkspaceStatus.ACTIVE).first())
        if existing is not None and Path(existing.path).is_dir():
            with transaction.atomic():
                Issue.objects.filter(pk=issue.pk).update(execution_workspace=existing, updated_at=timezone.now())
            return _Realized(existing, created=False)
        if existing is not None:
            _mark_status(workspace=existing, status=WorkspaceStatus.FAILED, note="folder missing at admission")
        _clear_stale_path(path, repo)
        start = _start_point(repo, project.base_ref, (project.repository or "").strip())
        created_branch = not gitops.ref_exists(repo, f"refs/heads/{branch}")
        tenant = gitops.is_http_url(project.repository or "")  # its checkout runs no filter of the server's
        if created_branch:
            gitops.git("worktree", "add", "--quiet", "--no-track", "-b", branch, str(path), start, cwd=repo,
                       isolated=tenant)
        else:  # the issue's branch survived an earlier removal: keep its commits
            gitops.git("worktree", "add", "--quiet", str(path), branch, cwd=repo, isolated=tenant)
        try:
            with transaction.atomic():
                workspace = ExecutionWorkspace.objects.create(
                    company_id=issue.company_id, project=project, source_issue=issue,
                    strategy=WorkspaceStrategy.ISOLATED, key=key, path=str(path), branch=branch,
                    base_ref=start if created_branch else "", status=WorkspaceStatus.ACTIVE)
                Issue.objects.filter(pk=issue.pk).update(execution_workspace=workspace, updated_at=timezone.now())
                activity_record(actor=SYSTEM, company_id=issue.company_id, action="workspace.created",
                                entity_type="workspace", entity_id=workspace.pk,
                                details={"issueId": str(issue.pk), "key": key, "branch": branch,
                                         "baseRef": workspace.base_ref})
        except BaseException:
            _remove_worktree(path, root=root, delete_branch=branch if created_branch else None)
            raise
    return _Realized(workspace, created=True, created_branch=created_branch)


def _discard_new(*, realized: _Realized, issue: Issue, run: HeartbeatRun):
    """after_create failed: the new workspace is not used (Symphony: fatal to the attempt)."""
    workspace = realized.workspace
    if workspace.strategy == WorkspaceStrategy.ISOLATED:
        _remove_worktree(Path(workspace.path), root=workspace_root(),
                         delete_branch=workspace.branch if realized.created_branch else None)
    _mark_status(workspace=workspace, status=WorkspaceStatus.FAILED, note="after_create failed")
    _unbind(issue=issue, workspace=workspace)


def _mark_status(*, workspace: ExecutionWorkspace, status: str, note: str = ""):
    now = timezone.now()
    with transaction.atomic():
        ExecutionWorkspace.objects.filter(pk=workspace.pk).update(
            status=status, writer_run=None, updated_at=now,
            removed_at=now if status == WorkspaceStatus.REMOVED else None)
    if note:
        logger.warning("workspace %s marked %s: %s", workspace.pk, status, note)
    workspace.refresh_from_db()


def _claim_writer(*, workspace: ExecutionWorkspace, run: HeartbeatRun) -> bool:
    """Make ``run`` the one writer; ``False`` when the workspace is no longer active."""
    with transaction.atomic():
        locked = ExecutionWorkspace.objects.select_for_update().get(pk=workspace.pk)
        if locked.status != WorkspaceStatus.ACTIVE:
            return False
        writer_id = locked.writer_run_id
        if writer_id and writer_id != run.pk:
            writer = HeartbeatRun.objects.filter(pk=writer_id).values("status", "issue_id").first()
            if writer is not None and writer["status"] in LIVE_RUN_STATUSES:
                raise WorkspaceBusy(details={
                    "workspaceId": str(locked.pk), "writerRunId": str(writer_id),
                    "writerIssueId": str(writer["issue_id"]) if writer["issue_id"] else None})
        # No writer, or one whose run has ended: this run takes over.
        locked.writer_run_id = run.pk
        locked.save(update_fields=["writer_run", "updated_at"])
    workspace.writer_run_id = run.pk
    return True


def _release_writer(*, workspace: ExecutionWorkspace, run: HeartbeatRun):
    now = timezone.now()
    with transaction.atomic():
        ExecutionWorkspace.objects.filter(pk=workspace.pk, writer_run_id=run.pk).update(
            writer_run=None, last_used_at=now, updated_at=now)


# --- hooks ----------------------------------------------------------------------------------------

def _hook(workspace: ExecutionWorkspace, name: str, *, issue: Issue | None, run: HeartbeatRun | None
          ) -> HookResult | None:
    """Run hook ``name``; record it in ``hook_log``. ``None`` if unset. The command and its timeout
    come from the run policy: the project's hooks and ``hook_timeout_seconds``, else the effective
    WORKFLOW.md's ``hooks.*`` and ``hooks.timeout_ms``, else the default timeout."""
    from issues.services.run_policy import run_policy_for

    policy = run_policy_for(agent=run.agent if run is not None else None, issue=issue, project=workspace.project)
    command = hook_command(policy.hooks, name)
    if not command:
        if name in policy.hooks_ignored:  # a hook from a document no staff user vouches for: said, not run
            _ignored_hook_note(name, policy.hooks_ignored[name], workspace=workspace, run=run)
        return None
    timeout = policy.hook_timeout_seconds or DEFAULT_HOOK_TIMEOUT
    env = {
        "PAPERCLIP_WORKSPACE_PATH": workspace.path,
        "PAPERCLIP_WORKSPACE_ID": workspace.pk,
        "PAPERCLIP_WORKSPACE_KEY": workspace.key,
        "PAPERCLIP_WORKSPACE_STRATEGY": workspace.strategy,
        "PAPERCLIP_WORKSPACE_BRANCH": workspace.branch,
        "PAPERCLIP_ISSUE_IDENTIFIER": issue.identifier if issue is not None else "",
        "PAPERCLIP_ISSUE_ID": issue.pk if issue is not None else "",
        "PAPERCLIP_RUN_ID": run.pk if run is not None else "",
        "PAPERCLIP_HOOK": name,
    }
    result = run_hook(name=name, command=command, cwd=workspace.path, timeout=timeout, env=env,
                      run_id=run.pk if run is not None else None)
    _append_hook_log(workspace, result.as_log())
    if not result.ok:
        logger.warning("workspace hook %s failed for workspace %s (exit %s, timed out %s)", name, workspace.pk,
                       result.exit_code, result.timed_out)
    return result


def _ignored_hook_note(name: str, reason: str, *, workspace: ExecutionWorkspace, run: HeartbeatRun | None):
    from issues.choices import RunEventKind
    from issues.services.runs import run_append_event

    message = f"workspace hook {name} from the workflow document was not run: {reason}."
    logger.warning("workspace %s: %s", workspace.pk, message)
    if run is not None:
        run_append_event(run_id=run.pk, kind=RunEventKind.SYSTEM, message=message,
                         data={"hook": name, "hookIgnored": True}, liveness=False)


def _append_hook_log(workspace: ExecutionWorkspace, entry: dict):
    with transaction.atomic():
        locked = ExecutionWorkspace.objects.select_for_update().get(pk=workspace.pk)
        locked.hook_log = (list(locked.hook_log or []) + [entry])[-HOOK_LOG_LIMIT:]
        locked.save(update_fields=["hook_log", "updated_at"])
    workspace.hook_log = locked.hook_log


# --- after the run, removal, retention ------------------------------------------------------------

def workspace_after_run(*, run: HeartbeatRun) -> ExecutionWorkspace | None:
    """Run ``after_run`` (a failure is only logged) and release the run's writer claim."""
    run = HeartbeatRun.objects.select_related("issue", "workspace__project").get(pk=run.pk)
    workspace = run.workspace
    if workspace is None:
        return None
    if workspace.status == WorkspaceStatus.ACTIVE and Path(workspace.path).is_dir():
        _hook(workspace, "after_run", issue=run.issue, run=run)
    _release_writer(workspace=workspace, run=run)
    workspace.refresh_from_db()
    return workspace


def _has_live_run(workspace: ExecutionWorkspace, issue_ids=()) -> bool:
    condition = Q(workspace_id=workspace.pk)
    if workspace.writer_run_id:
        condition |= Q(pk=workspace.writer_run_id)
    if issue_ids:
        condition |= Q(issue_id__in=list(issue_ids))
    return HeartbeatRun.objects.filter(condition, status__in=LIVE_RUN_STATUSES).exists()


def _remove_worktree(path: Path, *, root: Path, delete_branch: str | None = None):
    """``git worktree remove --force`` (then a plain delete inside the root as a fallback)."""
    lexical = _lexically_inside(path, root)
    if lexical.is_symlink():  # never follow it: drop the link only, its target is not ours to delete
        lexical.unlink()
        return
    path = _inside_root(path, root)
    common = gitops.common_git_dir(path) if path.is_dir() else None
    errors = []
    if common is not None:
        proc = gitops.git("--git-dir", str(common), "worktree", "remove", "--force", "--force", str(path),
                          check=False)
        if proc.returncode != 0:
            errors.append(proc.stderr.strip())
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)
    if common is not None:
        gitops.git("--git-dir", str(common), "worktree", "prune", check=False)
        if delete_branch:
            gitops.git("--git-dir", str(common), "branch", "-D", delete_branch, check=False)
    if errors:
        logger.warning("git worktree remove %s: %s", path, "; ".join(errors))


def workspace_remove(*, workspace: ExecutionWorkspace) -> ExecutionWorkspace:
    """Remove a workspace: ``before_remove`` (failure logged), ``git worktree remove --force`` (the
    branch is kept), status ``removed``. A shared workspace only detaches: the project folder is
    never deleted and no hook runs in it. Refuses (:class:`WorkspaceBusy`) while a run is live there.
    """
    root = workspace_root()
    with transaction.atomic():
        locked = ExecutionWorkspace.objects.select_for_update().get(pk=workspace.pk)
        if locked.status != WorkspaceStatus.ACTIVE:
            return locked
        if _has_live_run(locked):
            raise WorkspaceBusy("A live run is using this workspace.", details={"workspaceId": str(locked.pk)})
        if locked.strategy != WorkspaceStrategy.SHARED:
            _lexically_inside(locked.path, root)  # never delete outside the root
    locked = ExecutionWorkspace.objects.select_related("project", "source_issue").get(pk=locked.pk)

    if locked.strategy != WorkspaceStrategy.SHARED:
        path = Path(locked.path)
        if path.is_dir() and not path.is_symlink():
            _hook(locked, "before_remove", issue=locked.source_issue, run=None)
        _remove_worktree(path, root=root)

    now = timezone.now()
    with transaction.atomic():
        ExecutionWorkspace.objects.filter(pk=locked.pk).update(
            status=WorkspaceStatus.REMOVED, removed_at=now, writer_run=None, updated_at=now)
        activity_record(actor=SYSTEM, company_id=locked.company_id, action="workspace.removed",
                        entity_type="workspace", entity_id=locked.pk,
                        details={"key": locked.key, "branch": locked.branch, "strategy": locked.strategy})
    locked.refresh_from_db()
    return locked


def _ended_at(issue: Issue):
    if issue.status == IssueStatus.DONE:
        return issue.completed_at or issue.updated_at
    return issue.cancelled_at or issue.updated_at


def workspace_retention_sweep(*, now=None) -> dict:
    """Remove isolated workspaces whose issues are all done/cancelled for longer than
    ``WORKSPACE_RETENTION_SECONDS`` and have no live run; report disk usage against the cap."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=int(settings.PAPERCLIP["WORKSPACE_RETENTION_SECONDS"]))
    counts = {"checked": 0, "removed": 0, "kept_live": 0, "not_due": 0, "failed": 0}
    candidate_ids = list(ExecutionWorkspace.objects.filter(
        status=WorkspaceStatus.ACTIVE, strategy=WorkspaceStrategy.ISOLATED).values_list("pk", flat=True))
    for workspace in ExecutionWorkspace.objects.filter(pk__in=candidate_ids, status=WorkspaceStatus.ACTIVE):
        counts["checked"] += 1
        condition = Q(execution_workspace_id=workspace.pk)
        if workspace.source_issue_id:
            condition |= Q(pk=workspace.source_issue_id)
        issues = list(Issue.objects.filter(condition))
        if issues:
            due = all(i.status in TERMINAL_ISSUE_STATUSES and _ended_at(i) <= cutoff for i in issues)
        else:  # orphaned (its issue was deleted)
            due = (workspace.last_used_at or workspace.created_at) <= cutoff
        if not due:
            counts["not_due"] += 1
            continue
        if _has_live_run(workspace, [i.pk for i in issues]):
            counts["kept_live"] += 1
            continue
        try:
            workspace_remove(workspace=workspace)
            counts["removed"] += 1
        except WorkspaceBusy:
            counts["kept_live"] += 1
        except (ApiError, OSError) as exc:
            counts["failed"] += 1
            logger.warning("retention could not remove workspace %s: %s", workspace.pk, exc)
    return {**counts, **workspace_health()}


def workspace_disk_usage(root: Path | None = None) -> int:
    """Apparent size in bytes of the files under the root (symlinks not followed, hard links once)."""
    root = root or workspace_root()
    total, seen = 0, set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in filenames + dirnames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


def workspace_health() -> dict:
    """For the health endpoint: disk used under the root against ``WORKSPACE_DISK_CAP_BYTES``."""
    root = workspace_root()
    used = workspace_disk_usage(root)
    cap = int(settings.PAPERCLIP.get("WORKSPACE_DISK_CAP_BYTES") or 0)
    return {
        "root": str(root),
        "disk_bytes": used,
        "disk_cap_bytes": cap,
        "over_cap": bool(cap) and used > cap,
        "active_workspaces": ExecutionWorkspace.objects.filter(status=WorkspaceStatus.ACTIVE).count(),
    }
