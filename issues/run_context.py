"""What a run is told about its wake, in one shape for every adapter (issue #13).

A wake's facts live in ``run.context`` (keys agreed across the wake paths: ``commentIds``,
``wakeCommentId``, ``approvalId``, ``approvalStatus``, ``issueIds``, ``interactionId``,
``interactionStatus``, ``blockerIssueIds``, ``childIssueIds``, ``continuationAttempt``,
``instruction``, ``retryAttempt``, ``taskPacket``, ``connectorLinkId``, ``wakeReasons``) plus the
run's own columns. From them this module builds

* :func:`wake_facts`: the typed facts (no query), shared by the process env, the signed HTTP wake
  payload and the API reads (``GET /api/runs/{id}``, ``GET /api/agents/me/wake``);
* :func:`context_env`: the optional upstream ``PAPERCLIP_*`` variables, set only when non-empty;
* :func:`wake_payload`: the compact ``PAPERCLIP_WAKE_PAYLOAD_JSON`` (issue summary, reason, the
  wake's comments in order, capped, ``fallbackFetchNeeded`` when something was left out);
* :func:`task_packet`: the connector-rendered packet of a tracker-driven run, else a host packet
  rendered here (issue, parent, why the agent was woken, related issues, API hints);
* :func:`packet_file_write`: the packet as a file the agent reads via ``PAPERCLIP_TASK_PACKET_PATH``.

Sizes are bounded: the packet, each comment body and the number of comments are capped.
"""
from __future__ import annotations

import json
import os
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from issues.choices import WorkspaceStrategy
from issues.models import Comment, Issue
from issues.workspaces import gitops

PACKET_MAX_CHARS = 32_000
DESCRIPTION_MAX_CHARS = 12_000
PAYLOAD_MAX_COMMENTS = 10
COMMENT_BODY_MAX_CHARS = 2_000
WAKE_REASONS_KEPT = 20  # run.context["wakeReasons"]: the newest this many, oldest first
PACKET_DIR = ".paperclip"
PACKET_NAME = "task-packet.md"
CONTINUATION_REASON = "liveness_continuation"


@dataclass(frozen=True)
class WakeFacts:
    reason: str
    reasons: list[str]
    comment_ids: list[str]
    wake_comment_id: str | None
    approval_id: str | None
    approval_status: str | None
    linked_issue_ids: list[str]
    interaction_id: str | None
    interaction_status: str | None
    blocker_issue_ids: list[str]
    child_issue_ids: list[str]
    continuation_attempt: int
    instruction: str
    retry_attempt: int
    connector_packet: str | None
    connector_link_id: str | None

    def as_dict(self) -> dict:
        """The same fields under the API's names (HTTP wake payload, ``/agents/me/wake``)."""
        return {
            "wakeReason": self.reason, "wakeReasons": self.reasons, "commentIds": self.comment_ids,
            "wakeCommentId": self.wake_comment_id, "approvalId": self.approval_id,
            "approvalStatus": self.approval_status, "linkedIssueIds": self.linked_issue_ids,
            "interactionId": self.interaction_id, "interactionStatus": self.interaction_status,
            "blockerIssueIds": self.blocker_issue_ids, "childIssueIds": self.child_issue_ids,
            "continuation": ({"attempt": self.continuation_attempt, "instruction": self.instruction}
                             if self.continuation_attempt else None),
            "retryAttempt": self.retry_attempt or None, "connectorLinkId": self.connector_link_id,
        }


def _ids(value) -> list[str]:
    if not value:
        return []
    if isinstance(value, (str, uuid.UUID)):
        value = [value]
    return [str(v) for v in value if v]


def _str(value) -> str | None:
    return str(value) if value not in (None, "") else None


def _int(value) -> int:
    try:
        return max(int(value or 0), 0)
    except (TypeError, ValueError):
        return 0


def context_merged(current: dict, wake_reason: str, comment_ids: list[str], reason: str, context: dict) -> dict:
    """A run's context after one more wake joins it: the wake's keys win; comment ids are a union in
    arrival order; ``wakeReasons`` lists reasons oldest first (the newest WAKE_REASONS_KEPT).
    ``wake_reason`` is the run's reason column (the first entry when the context has no list yet)."""
    current = current or {}
    merged = {**current, **{k: v for k, v in context.items() if k not in ("commentIds", "wakeReasons")}}
    if comment_ids:
        known = current.get("commentIds", [])
        merged["commentIds"] = known + [c for c in comment_ids if c not in known]
        if "wakeCommentId" not in context and "wakeCommentId" in current:
            merged["wakeCommentId"] = comment_ids[-1]  # the newest wake's comment, not an older one
    if reason:
        reasons = list(current.get("wakeReasons") or ([wake_reason] if wake_reason else []))
        merged["wakeReasons"] = (reasons + [reason])[-WAKE_REASONS_KEPT:]
    return merged


def pending_wakes_apply(run, pending) -> None:
    """Carry wakes not yet folded into ``run`` (in memory, oldest first), as each would have been
    carried on arrival: ``pending`` holds (reason, context, comment_ids) triples."""
    for reason, context, comment_ids in pending:
        run.context = context_merged(run.context, run.wake_reason, [str(c) for c in comment_ids or ()], reason,
                                     context or {})
        if reason:
            run.wake_reason = reason


def wake_facts(run) -> WakeFacts:
    """The run's wake facts from ``run.context`` and its columns (no query)."""
    context = run.context or {}
    reason = run.wake_reason or context.get("reason") or ""
    comment_ids = _ids(context.get("commentIds"))
    reasons = [str(r) for r in context.get("wakeReasons") or ([reason] if reason else [])]
    continuation = _int(context.get("continuationAttempt")) or _int(run.continuation_attempt)
    packet = context.get("taskPacket")
    return WakeFacts(
        reason=reason, reasons=reasons, comment_ids=comment_ids,
        wake_comment_id=_str(context.get("wakeCommentId")) or (comment_ids[-1] if comment_ids else None),
        approval_id=_str(context.get("approvalId")), approval_status=_str(context.get("approvalStatus")),
        linked_issue_ids=_ids(context.get("issueIds")),
        interaction_id=_str(context.get("interactionId")),
        interaction_status=_str(context.get("interactionStatus")),
        blocker_issue_ids=_ids(context.get("blockerIssueIds")), child_issue_ids=_ids(context.get("childIssueIds")),
        continuation_attempt=continuation, instruction=str(context.get("instruction") or "") if continuation else "",
        retry_attempt=_int(context.get("retryAttempt")) or _int(run.retry_attempt),
        connector_packet=packet if isinstance(packet, str) and packet else None,
        connector_link_id=_str(context.get("connectorLinkId")),
    )


def context_env(facts: WakeFacts) -> dict[str, str]:
    """The optional upstream variables (paperclip-api.md §3), each only when it has a value."""
    values = {
        "PAPERCLIP_WAKE_COMMENT_ID": facts.wake_comment_id,
        "PAPERCLIP_APPROVAL_ID": facts.approval_id,
        "PAPERCLIP_APPROVAL_STATUS": facts.approval_status,
        "PAPERCLIP_LINKED_ISSUE_IDS": ",".join(facts.linked_issue_ids),
        "PAPERCLIP_INTERACTION_ID": facts.interaction_id,
        "PAPERCLIP_INTERACTION_STATUS": facts.interaction_status,
        "PAPERCLIP_CONTINUATION_ATTEMPT": str(facts.continuation_attempt) if facts.continuation_attempt else "",
        "PAPERCLIP_CONTINUATION_INSTRUCTION": facts.instruction,
        "PAPERCLIP_RETRY_ATTEMPT": str(facts.retry_attempt) if facts.retry_attempt else "",
    }
    return {name: value for name, value in values.items() if value}


# Upstream's PAPERCLIP_WORKSPACE_SOURCE: why this folder (the project's checkout or the task's own).
WORKSPACE_SOURCES = {WorkspaceStrategy.SHARED: "project_primary", WorkspaceStrategy.ISOLATED: "task_session"}


def _public_repo_url(repository: str) -> str:
    """The project's repository when it is a URL, without credentials (agents log their env)."""
    repository = (repository or "").strip()
    if not gitops.is_url(repository):
        return ""  # a local path is not a remote URL
    parts = urlsplit(repository)
    if not parts.scheme or "@" not in parts.netloc:
        return repository  # scp-style git@host:path names a user, never a secret
    userinfo, host = parts.netloc.rsplit("@", 1)
    # http(s): user names there are tokens too; other schemes (ssh) keep the user, never a password.
    user = "" if parts.scheme.lower() in ("http", "https") else userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}" if user else host))


def workspace_env(workspace) -> dict[str, str]:
    """Workspace facts for the agent (the run's ExecutionWorkspace, when it has one). STRATEGY keeps
    this project's names (``shared_workspace`` / ``isolated_workspace``, upstream's workspace modes)."""
    if workspace is None:
        return {}
    project = workspace.project if workspace.project_id else None
    values = {"PAPERCLIP_WORKSPACE_CWD": workspace.path, "PAPERCLIP_WORKSPACE_ID": str(workspace.pk),
              "PAPERCLIP_WORKSPACE_BRANCH": workspace.branch, "PAPERCLIP_WORKSPACE_STRATEGY": workspace.strategy,
              "PAPERCLIP_WORKSPACE_SOURCE": WORKSPACE_SOURCES.get(workspace.strategy, ""),
              "PAPERCLIP_WORKSPACE_REPO_URL": _public_repo_url(project.repository) if project else "",
              "PAPERCLIP_WORKSPACE_REPO_REF": workspace.base_ref,
              "PAPERCLIP_WORKSPACE_WORKTREE_PATH":
                  workspace.path if workspace.strategy == WorkspaceStrategy.ISOLATED else ""}
    return {name: value for name, value in values.items() if value}


# --- the wake's comments and the compact payload -------------------------------------------------

def _uuid_strings(ids) -> list[str]:
    out = []
    for value in ids:
        try:
            out.append(str(uuid.UUID(str(value))))
        except ValueError:
            continue
    return out


def wake_comments(run, facts: WakeFacts) -> tuple[list[dict], bool]:
    """The wake's comments oldest first (the newest :data:`PAYLOAD_MAX_COMMENTS`, bodies capped) and
    whether anything was left out. One query, only when the wake names comments."""
    ids = _uuid_strings(facts.comment_ids)
    if not ids:
        return [], False
    kept = ids[-PAYLOAD_MAX_COMMENTS:]
    rows = (Comment.objects.filter(pk__in=kept, company_id=run.company_id)
            .order_by("created_at", "id").values("id", "author_type", "author_agent_id", "body", "created_at"))
    comments, capped = [], len(kept) < len(ids)
    for row in rows:
        body = row["body"]
        if len(body) > COMMENT_BODY_MAX_CHARS:
            body, capped = body[:COMMENT_BODY_MAX_CHARS], True
        comments.append({"id": str(row["id"]), "authorType": row["author_type"],
                         "authorAgentId": str(row["author_agent_id"]) if row["author_agent_id"] else None,
                         "body": body, "createdAt": row["created_at"].isoformat()})
    return comments, capped


def issue_summary(issue) -> dict | None:
    if issue is None:
        return None
    return {"id": str(issue.pk), "identifier": issue.identifier, "title": issue.title, "status": issue.status,
            "priority": issue.priority, "parentId": str(issue.parent_id) if issue.parent_id else None}


def wake_payload(issue, facts: WakeFacts, comments: list[dict], capped: bool) -> dict:
    """``PAPERCLIP_WAKE_PAYLOAD_JSON``: read it before fetching anything; ``fallbackFetchNeeded``
    says the batch is incomplete (fetch the thread)."""
    payload = {"reason": facts.reason or None, "reasons": facts.reasons, "issue": issue_summary(issue),
               "comments": comments}
    if capped:
        payload["fallbackFetchNeeded"] = True
    return payload


def payload_json(payload: dict) -> str:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, default=str)


# --- the task packet -------------------------------------------------------------------------------

def _cap(text: str, limit: int, what: str) -> str:
    if len(text) <= limit:
        return text
    return text[:limit].rstrip() + f"\n\n[{what} truncated at {limit} characters; read the full text through the API]\n"


def _related(issue, facts: WakeFacts, company_id) -> dict[str, Issue]:
    """The parent and every linked/blocker/child issue of the run's company, in one query."""
    ids = set(_uuid_strings([*facts.linked_issue_ids, *facts.blocker_issue_ids, *facts.child_issue_ids]))
    if issue is not None and issue.parent_id:
        ids.add(str(issue.parent_id))
    if not ids:
        return {}
    qs = Issue.objects.filter(pk__in=ids, company_id=company_id).only("id", "identifier", "title", "status")
    return {str(i.pk): i for i in qs}


def _issue_line(pk: str, related: dict) -> str:
    other = related.get(pk)
    return f"- {other.identifier} ({other.status}): {other.title} — id {pk}" if other else f"- id {pk}"


def host_packet(run, issue, facts: WakeFacts, comments: list[dict]) -> str:
    """The host's task packet for a run that is not tracker-driven."""
    related = _related(issue, facts, run.company_id)
    run_id = str(run.pk)
    lines = []
    if issue is not None:
        lines += [f"# {issue.identifier}: {issue.title}", "",
                  f"Status: {issue.status} · Priority: {issue.priority} · Issue id: {issue.pk}"]
        if issue.parent_id:
            parent = related.get(str(issue.parent_id))
            lines.append(f"Parent: {parent.identifier}: {parent.title} ({parent.status})" if parent
                         else f"Parent: id {issue.parent_id}")
    else:
        lines += ["# Wake without an issue", "", "Pick your next task from your inbox (step 3 of the heartbeat)."]
    lines += ["", "## Why you were woken", f"Reason: {facts.reason or '(none given)'}"]
    if len(facts.reasons) > 1:
        lines.append("Reasons coalesced into this run (oldest first): " + ", ".join(facts.reasons))
    if facts.continuation_attempt:
        lines.append(f"Continuation attempt {facts.continuation_attempt}: {facts.instruction or 'continue the task.'}")
    if facts.retry_attempt:
        lines.append(f"Retry attempt {facts.retry_attempt} (an earlier run of this task did not finish).")
    if facts.approval_id:
        lines.append(f"Approval {facts.approval_id}: {facts.approval_status or 'see the approval'}")
    if facts.interaction_id:
        lines.append(f"Interaction {facts.interaction_id}: {facts.interaction_status or 'answered'}")
    for title, ids in (("Linked issues", facts.linked_issue_ids), ("Resolved blockers", facts.blocker_issue_ids),
                       ("Children", facts.child_issue_ids)):
        if ids:
            lines += [f"{title}:", *(_issue_line(pk, related) for pk in ids)]
    if comments:
        lines += ["", "## Comments that triggered this wake (oldest first)"]
        for c in comments:
            author = f"agent {c['authorAgentId']}" if c["authorAgentId"] else c["authorType"]
            lines += ["", f"Comment {c['id']} by {author} at {c['createdAt']}:",
                      *(f"> {line}" for line in c["body"].splitlines() or [""])]
    if issue is not None:
        description = _cap(issue.description or "(no description)", DESCRIPTION_MAX_CHARS, "description")
        lines += ["", "## Description", description.rstrip("\n")]
    lines += ["", "## Working through the API",
              "Base URL: $PAPERCLIP_API_URL/api (the variable is the server origin). Authenticate with "
              f"$PAPERCLIP_API_KEY and send `X-Paperclip-Run-Id: {run_id}` on every mutation."]
    if issue is not None:
        lines += [f"- Claim it first: POST /issues/{issue.pk}/checkout (409 means someone else holds it: "
                  "move to your next task)",
                  f"- Read: GET /issues/{issue.pk}, GET /issues/{issue.pk}/comments",
                  f"- Report: POST /issues/{issue.pk}/comments; finish with PATCH /issues/{issue.pk} "
                  "(status done, in_review or blocked)"]
    lines += [f"- This wake: GET /agents/me/wake, GET /runs/{run_id}"]
    return "\n".join(lines) + "\n"


def task_packet(run, issue, facts: WakeFacts, comments: list[dict]) -> str:
    """The connector-rendered packet of a tracker-driven run, else the host packet; capped."""
    text = facts.connector_packet or host_packet(run, issue, facts, comments)
    return _cap(text, PACKET_MAX_CHARS, "task packet")


@dataclass
class WakeContext:
    """Everything :func:`build` derives for one run (what ``prepare_context`` hands the adapter)."""

    facts: WakeFacts
    env: dict[str, str] = field(default_factory=dict)  # optional variables, non-empty only
    payload: dict = field(default_factory=dict)  # PAPERCLIP_WAKE_PAYLOAD_JSON
    packet: str = ""


def build(run, issue) -> WakeContext:
    """The run's wake context: at most two queries (the wake's comments, the related issues)."""
    facts = wake_facts(run)
    comments, capped = wake_comments(run, facts)
    payload = wake_payload(issue, facts, comments, capped)
    env = context_env(facts)
    env["PAPERCLIP_WAKE_PAYLOAD_JSON"] = payload_json(payload)
    return WakeContext(facts=facts, env=env, payload=payload, packet=task_packet(run, issue, facts, comments))


def run_context_view(run) -> dict:
    """A run's wake context for the API (``GET /api/agents/me/wake``): the facts, and the packet."""
    facts = wake_facts(run)
    comments, _ = wake_comments(run, facts) if facts.connector_packet is None else ([], False)
    return {**facts.as_dict(), "runId": str(run.pk), "taskPacket": task_packet(run, run.issue, facts, comments)}


# --- the packet file ---------------------------------------------------------------------------------

def _write_atomic(path: Path, text: str):
    fd, tmp = tempfile.mkstemp(prefix=".task-packet-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _ignore_file_create(path: Path):
    """The folder's ``.gitignore``, created only where nothing is: never through a symlink (the
    repository's content is the tenant's, and a link could name any file the server may write)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        return
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write("# written by the Paperclip host for each run\n*\n")


def packet_file_write(text: str, *, workspace_path: str | None, run_id) -> tuple[str, bool]:
    """Write the packet; returns (path, temporary). In a workspace it is
    ``<workspace>/.paperclip/task-packet.md`` (kept, rewritten by the next run; the folder ignores
    itself, so ``git status`` never shows it); without one (or when the workspace cannot be
    written) it is a private temp file the caller removes after the run."""
    if workspace_path and os.path.isdir(workspace_path):
        folder = Path(workspace_path) / PACKET_DIR
        try:
            if folder.is_symlink():
                raise OSError("the packet folder is a symlink")
            folder.mkdir(exist_ok=True)
            _ignore_file_create(folder / ".gitignore")
            path = folder / PACKET_NAME  # (replaced, never written through: a symlink there is replaced)
            _write_atomic(path, text)
            return str(path), False
        except OSError:
            pass  # a read-only or odd workspace: fall back to a temp file
    fd, path = tempfile.mkstemp(prefix=f"paperclip-packet-{run_id}-", suffix=".md")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path, True
