"""Reads shared by the API, the console and the templates. Everything is company-scoped."""
import re
import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import Q

from issues.actors import Actor, uuid_or_none
from issues.choices import TERMINAL_ISSUE_STATUSES
from issues.exceptions import Forbidden, InvalidInput, NotFound
from issues.filtersets import IssueFilterSet
from issues.models import Agent, Approval, Attachment, Comment, Document, HeartbeatRun, Issue, RunEvent, WakeupRequest
from issues.models.attachment import attachment_storage
from issues.operator_alerts import operator_alerts

ISSUE_RELATED = ("assignee_agent", "assignee_user", "project", "goal", "parent", "company")


def is_identifier(pk) -> bool:
    """``PAP-12`` rather than a UUID."""
    return "-" in str(pk) and len(str(pk)) < 25


def issue_get(*, actor: Actor, pk) -> Issue:
    """By UUID or by identifier (``PAP-12``)."""
    return get_by_ref(Issue.objects.select_related(*ISSUE_RELATED), actor, pk, "Issue")


def issue_row(*, actor: Actor, pk) -> Issue:
    """The issue's own columns only (no joins): for writes that answer with the issue itself."""
    return get_by_ref(Issue.objects.all(), actor, pk, "Issue")


def get_by_ref(queryset, actor: Actor, pk, label: str):
    """By UUID or by identifier (``PAP-12``, ``PAP-C3``), inside the actor's companies."""
    field, value = ("identifier", str(pk).upper()) if is_identifier(pk) else ("pk", pk)
    return scoped_get(queryset, actor, value, label, field=field)


def issue_detail(*, actor: Actor, pk) -> Issue:
    issue = issue_get(actor=actor, pk=pk)
    issue.ancestors = ancestors(issue)
    # Upstream: every blocker and every blocked issue, each with its status (one query each).
    relations = Issue.objects.filter(company_id=issue.company_id).order_by("created_at", "id")
    issue.blocked_by = list(relations.filter(outgoing_relations__related_issue=issue,
                                             outgoing_relations__kind="blocks"))
    issue.blocks = list(relations.filter(incoming_relations__issue=issue, incoming_relations__kind="blocks"))
    return issue


CONTINUATION_SUMMARY_KEY = "continuation-summary"  # upstream's document key for a run's hand-over notes


def heartbeat_context(*, actor: Actor, pk, wake_comment_id=None) -> dict:
    """``GET /issues/{id}/heartbeat-context`` (ref §5.2, 2026): what an agent reads at the start of a
    wake, in one answer: the issue with its blockers, its ancestors, project and goal, the comment
    cursor (count and latest) to read the thread incrementally from, the wake comment when it is this
    issue's, and the continuation summary document (withheld while quarantined)."""
    issue = issue_detail(actor=actor, pk=pk)
    wake = None
    if wake_comment_id:
        wake = Comment.objects.filter(issue=issue, pk=_uuid_or_error(wake_comment_id, "wakeCommentId")).first()
    thread = Comment.objects.filter(issue=issue)
    latest = thread.order_by("-created_at", "-id").values("id", "created_at").first()
    summary = (Document.objects.select_related("latest_revision")
               .filter(issue=issue, key=CONTINUATION_SUMMARY_KEY, quarantined_at__isnull=True).first())
    return {"issue": issue, "ancestors": issue.ancestors, "project": issue.project, "goal": issue.goal,
            "commentCursor": {"totalComments": thread.count(), "latestCommentId": latest and latest["id"],
                              "latestCommentAt": latest and latest["created_at"]},
            "wakeComment": wake, "attachments": attachment_list(issue=issue), "continuationSummary": summary}


def attachment_list(*, issue: Issue) -> list[Attachment]:
    """The issue's attachments, oldest first, with who uploaded each (one query)."""
    return list(Attachment.objects.filter(issue=issue).select_related("author_agent", "author_user")
                .order_by("created_at", "id"))


def attachment_get(*, actor: Actor, pk) -> Attachment:
    """One attachment of the actor's companies (with its issue, for the write fences); else a 404."""
    return scoped_get(Attachment.objects.select_related("issue"), actor, pk, "Attachment")


def attachment_content(attachment: Attachment):
    """The stored bytes as an open file; bytes missing from storage are a 404 like a missing row."""
    return _stored_bytes(attachment.object_key, "Attachment", "attachment_content_missing")


def asset_get(*, actor: Actor, pk):
    """One asset (a company logo) of the actor's companies; else a 404."""
    from issues.models import Asset

    return scoped_get(Asset.objects.all(), actor, pk, "Asset")


def asset_content(asset):
    return _stored_bytes(asset.object_key, "Asset", "asset_content_missing")


def _stored_bytes(key: str, label: str, code: str):
    try:
        return attachment_storage().open(key, "rb")
    except FileNotFoundError:
        raise NotFound(f"{label} content not found", code=code)


def walk_up(node, attr: str = "parent"):
    """Yield ``node``'s ancestors along ``attr``, nearest first; stops on a cycle."""
    seen = {node.pk}
    node = getattr(node, attr)
    while node is not None and node.pk not in seen:
        yield node
        seen.add(node.pk)
        node = getattr(node, attr)


def ancestors(issue: Issue) -> list[Issue]:
    """Parent chain, nearest first, each with its project and goal (one query per level; trees are
    shallow); stops on a cycle."""
    chain, seen, parent_id = [], {issue.pk}, issue.parent_id
    while parent_id is not None and parent_id not in seen:
        node = Issue.objects.select_related("project", "goal").filter(pk=parent_id).first()
        if node is None:
            break
        chain.append(node)
        seen.add(node.pk)
        parent_id = node.parent_id
    return chain


def open_blockers(issue: Issue) -> list[Issue]:
    return list(
        # A cancelled blocker counts as resolved, as a done one does (wake_triggers, checkout).
        Issue.objects.filter(outgoing_relations__related_issue=issue, outgoing_relations__kind="blocks")
        .exclude(status__in=TERMINAL_ISSUE_STATUSES)
        .order_by("created_at")
    )


def chain_of_command(agent) -> list:
    return list(walk_up(agent, "reports_to"))


def approval_get(*, actor: Actor, pk) -> Approval:
    return scoped_get(Approval.objects.all(), actor, pk, "Approval")


def run_get(*, actor: Actor, pk) -> HeartbeatRun:
    qs = HeartbeatRun.objects.select_related("agent", "issue")
    if actor.is_agent:
        qs = qs.filter(agent=actor.agent)
    return scoped_get(qs, actor, pk, "Run")


def unfolded_wakes(run_ids) -> dict:
    """The insert-only fast path's wakes no fold has carried into their run yet, per run id, in
    arrival order: ``{run_id: [(wake_id, reason, context, comment_ids), ...]}`` (one query)."""
    pending: dict = {}
    for pk, run_id, reason, context, comment_ids in (
            WakeupRequest.objects.filter(run_id__in=list(run_ids), folded=False).order_by("created_at", "id")
            .values_list("pk", "run_id", "reason", "context", "comment_ids")):
        pending.setdefault(run_id, []).append((pk, reason, context, comment_ids))
    return pending


def runs_with_pending_wakes(runs: list) -> list:
    """Runs as readers should see them: with their unfolded wakes applied (in memory, never saved;
    one query, none for no runs). Runs read without their context (lists) are left as folded (the
    sweep folds within a tick)."""
    from issues.run_context import pending_wakes_apply

    with_context = {r.pk: r for r in runs if r is not None and "context" not in r.get_deferred_fields()}
    if with_context:
        for run_id, wakes in unfolded_wakes(with_context).items():
            pending_wakes_apply(with_context[run_id], [wake[1:] for wake in wakes])
    return runs


def run_with_pending_wakes(run: HeartbeatRun) -> HeartbeatRun:
    """One run as readers should see it (runs_with_pending_wakes)."""
    return runs_with_pending_wakes([run])[0]


def scoped_get(queryset, actor, pk, label, field="pk"):
    """One object of a company the actor belongs to; anything else is a 404."""
    ids = actor.company_ids
    if ids is not None:
        queryset = queryset.filter(company_id__in=ids)
    try:
        return queryset.get(**{field: pk})
    except (queryset.model.DoesNotExist, ValidationError, ValueError):
        raise NotFound(f"{label} not found.")


# The largest list offset (a signed 32-bit integer; the OpenAPI schema declares the same bound).
MAX_OFFSET = 2**31 - 1


# Query-string integers: ASCII digits only (int() would also take " 7", "1_0" or other scripts' digits).
_DIGITS = re.compile(r"[0-9]{1,19}", re.ASCII)


def bounded_int(raw, name: str, *, minimum: int = 0, maximum: int | None = None) -> int:
    """A query parameter that must be an integer in [minimum, maximum]; otherwise a 400 naming it.
    The default maximum (:data:`MAX_OFFSET`) keeps every value inside the databases' integer
    types, so a hostile number never reaches SQL (where it would be a 500)."""
    maximum = MAX_OFFSET if maximum is None else maximum
    text = str(raw)
    if not _DIGITS.fullmatch(text) or not minimum <= int(text) <= maximum:
        raise InvalidInput(details={name: [f"Must be an integer from {minimum} to {maximum}."]})
    return int(text)


def list_window(params) -> tuple[int, int]:
    """limit/offset from query parameters: integers from 1 (limit) or 0 (offset) to
    :data:`MAX_OFFSET`, else a 400 naming the parameter; a limit above ``API_LIST_MAX_LIMIT``
    is clamped to it (documented)."""
    errors = {}
    window = {"limit": settings.PAPERCLIP["API_LIST_DEFAULT_LIMIT"], "offset": 0}
    for name, minimum in (("limit", 1), ("offset", 0)):
        raw = params.get(name)
        if raw is None:
            continue
        try:
            window[name] = bounded_int(raw, name, minimum=minimum)
        except InvalidInput as exc:
            errors.update(exc.details)
    if errors:
        raise InvalidInput(details=errors)
    return min(window["limit"], settings.PAPERCLIP["API_LIST_MAX_LIMIT"]), window["offset"]


def issue_filterset(*, company, params, actor: Actor | None = None, annotations: dict | None = None) -> IssueFilterSet:
    """``actor`` resolves ``me`` in the user filters (a board user; without one ``me`` matches nothing);
    ``annotations`` add per-issue values to the rows (a view's own columns)."""
    return IssueFilterSet(
        data=params,
        queryset=Issue.objects.filter(company=company).select_related(*ISSUE_RELATED).order_by(
            "priority_rank", "created_at", "id"
        ).annotate(**(annotations or {})),
        me_user_id=actor.user.pk if actor is not None and actor.is_board else None,
    )


def refs_checked(filterset, company_id, page: list) -> list:
    """``page`` of a filtered list, after checking the ids its filters named (``COMPANY_REFS``): an id
    naming no object of the company (another company's) is a 404 naming the parameter, as everywhere.
    Only an empty page can hide one (rows are the company's), so a page with rows costs nothing."""
    if page:
        return page
    from django.apps import apps

    for param, label in getattr(filterset, "COMPANY_REFS", {}).items():
        value = filterset.form.cleaned_data.get(param)
        if value in (None, "", "null"):  # no filter, or upstream's "none set"
            continue
        model = apps.get_model(label)
        if not model.objects.filter(pk=value, company_id=company_id).exists():
            name = model._meta.verbose_name
            raise NotFound(f"{name.capitalize()} not found.", details={param: [f"No such {name} in this company."]})
    return page


def issue_list(*, company, params, actor: Actor | None = None, annotations: dict | None = None):
    """The inbox / issue list: the FilterSet's query, sorted by priority then age (or as asked);
    labels come with one more query for the whole page. Filter ids are checked (refs_checked)."""
    me = [name for name in IssueFilterSet.ME_PARAMS if params.get(name) == "me"]
    if me and actor is not None and not actor.is_board:
        raise Forbidden(f"{me[0]}=me requires board authentication", code="board_only")
    filterset = issue_filterset(company=company, params=params, actor=actor, annotations=annotations)
    if not filterset.is_valid():
        raise InvalidInput("Invalid filter.", code="invalid_filter", details=filterset.errors)
    limit, offset = list_window(params)
    return refs_checked(filterset, company.pk, list(filterset.qs.prefetch_related("labels")[offset: offset + limit]))


COMMENT_PAGE_MAX = 500  # upstream's cap on one read of a thread


def comment_list(*, issue: Issue, params):
    """Upstream's thread read: newest first unless ``order=asc``; ``after`` (alias
    ``afterCommentId``) keeps the comments newer than that one; ``limit`` 1-500 (clamped), none = all."""
    ascending = str(params.get("order") or "").strip().lower() == "asc"
    qs = Comment.objects.filter(issue=issue).select_related("author_agent", "author_user").order_by(
        *(("created_at", "id") if ascending else ("-created_at", "-id")))
    name = "after" if params.get("after") else "afterCommentId"
    after = params.get(name)
    if after:
        anchor = Comment.objects.filter(issue=issue, pk=_uuid_or_error(after, name)).first()
        if anchor is None:
            raise InvalidInput(details={name: ["No such comment on this issue."]})
        qs = qs.filter(Q(created_at__gt=anchor.created_at) | Q(created_at=anchor.created_at, id__gt=anchor.id))
    limit = params.get("limit")
    if limit is None:
        return qs
    return qs[:min(bounded_int(limit, "limit", minimum=1), COMMENT_PAGE_MAX)]


def run_events(*, run: HeartbeatRun, params):
    """The run's log after a cursor (``after`` = last seq seen)."""
    qs = RunEvent.objects.filter(run=run).order_by("seq")
    after = params.get("after")
    if after is not None:
        qs = qs.filter(seq__gt=bounded_int(after, "after", maximum=2**63 - 1))  # seq is a 64-bit column
    limit, _ = list_window(params)
    return qs[:limit]


def document_list(*, issue: Issue):
    return Document.objects.select_related("latest_revision").filter(issue=issue).order_by("key")


def document_get(*, issue: Issue, key: str) -> Document:
    # Keys are stored lower-cased (issues.services.thread.document_write): PLAN reads plan, as upstream.
    document = Document.objects.select_related("latest_revision").filter(issue=issue, key=key.lower()).first()
    if document is None:
        raise NotFound("Document not found.")
    return document


def _uuid_or_error(value, field):
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise InvalidInput(details={field: ["Must be a UUID."]})


def host_health() -> dict:
    from django.db.models import Count

    from issues.workspaces.service import workspace_health

    by_status = dict(HeartbeatRun.objects.filter(status__in=("queued", "scheduled_retry", "running"))
                     .values("status").annotate(n=Count("id")).values_list("status", "n"))
    return {
        "database": "ok",
        "runs": {"queued": by_status.get("queued", 0), "scheduledRetry": by_status.get("scheduled_retry", 0),
                 "running": by_status.get("running", 0)},
        "workspaces": workspace_health(),
    }


# --- console reads (operator web console) ------------------------------------------------------------


def company_dashboard(*, company) -> dict:
    """Agents with live-run counts, open issues by status, live runs and pending interactions.
    A fixed number of queries whatever the company's size."""
    from django.db.models import Count

    from issues.choices import LIVE_RUN_STATUSES, TERMINAL_ISSUE_STATUSES, IssueStatus
    from issues.models import ActivityLog, Agent, Interaction

    agents = list(Agent.objects.filter(company=company).annotate(
        live_runs=Count("runs", filter=Q(runs__status__in=LIVE_RUN_STATUSES))).order_by("name"))
    counts = dict(Issue.objects.filter(company=company).exclude(status__in=TERMINAL_ISSUE_STATUSES)
                  .values("status").annotate(n=Count("id")).values_list("status", "n"))
    by_status = [(value, label, counts.get(value, 0)) for value, label in IssueStatus.choices
                 if value not in TERMINAL_ISSUE_STATUSES]
    live_runs = list(HeartbeatRun.objects.filter(company=company, status__in=LIVE_RUN_STATUSES)
                     .select_related("agent", "issue").order_by("-created_at")[:50])
    pending = Interaction.objects.filter(company=company, status="pending").count()
    activity = list(ActivityLog.objects.filter(company=company).select_related("actor_agent", "actor_user")[:15])
    return {"agents": agents, "issues_by_status": by_status, "open_issues": sum(counts.values()),
            "live_runs": live_runs, "pending_interactions": pending, "recent_activity": activity,
            "alerts": operator_alerts(company)}


def hire_approval(agent):
    """The open ``hire_agent`` approval an agent waiting as ``pending_approval`` waits for, or None."""
    from issues.choices import AgentStatus, ApprovalStatus, ApprovalType

    if agent.status != AgentStatus.PENDING_APPROVAL:
        return None
    return (Approval.objects.filter(company_id=agent.company_id, type=ApprovalType.HIRE_AGENT,
                                    status__in=(ApprovalStatus.PENDING, ApprovalStatus.REVISION_REQUESTED),
                                    payload__agentId=str(agent.pk)).order_by("-created_at").first())


def hired_agent(approval: Approval, *, lock: bool = False):
    """The agent a ``hire_agent`` approval is about (its payload's ``agentId``, in the approval's
    company), or None; ``lock``: row-locked until the caller commits."""
    from issues.choices import ApprovalType

    agent_id = approval.payload.get("agentId") if isinstance(approval.payload, dict) else None
    agent_id = uuid_or_none(agent_id) if isinstance(agent_id, str) else None
    if approval.type != ApprovalType.HIRE_AGENT or agent_id is None:
        return None
    agents = Agent.objects.select_for_update() if lock else Agent.objects.all()
    return agents.filter(pk=agent_id, company_id=approval.company_id).first()


def assignable_agents(*, company):
    """Agents a console form may offer for new work: everyone but the terminated and those whose hire
    waits for approval, by name."""
    from issues.choices import NO_WORK_AGENT_STATUSES

    return Agent.objects.filter(company=company).exclude(status__in=NO_WORK_AGENT_STATUSES).order_by("name").only(
        "id", "name")


def agent_console_list(*, company):
    """The company's agents with live-run counts and their manager (one query)."""
    from django.db.models import Count

    from issues.choices import LIVE_RUN_STATUSES
    from issues.models import Agent

    return (Agent.objects.filter(company=company).select_related("reports_to")
            .annotate(live_runs=Count("runs", filter=Q(runs__status__in=LIVE_RUN_STATUSES)))
            .order_by("name"))


def issue_thread(*, issue: Issue) -> dict:
    """Everything the issue page shows below the header, each list one query."""
    from issues.models import Interaction, WorkProduct

    return {
        "comments": list(Comment.objects.filter(issue=issue).select_related("author_agent", "author_user")
                         .order_by("created_at", "id")),
        "documents": list(Document.objects.filter(issue=issue).select_related(
            "latest_revision", "latest_revision__author_agent", "latest_revision__author_user").order_by("key")),
        "interactions": list(Interaction.objects.filter(issue=issue).select_related(
            "document_revision__document", "created_by_agent", "created_by_user", "responded_by")
            .order_by("-created_at")),
        "runs": list(HeartbeatRun.objects.filter(issue=issue).select_related("agent").order_by("-created_at")[:20]),
        "work_products": list(WorkProduct.objects.filter(issue=issue).order_by("created_at")),
    }


def document_revisions(*, document: Document):
    return document.revisions.select_related("author_agent", "author_user").order_by("-number")


def run_log_tail(*, run: HeartbeatRun, after: int | None = None, tail: int = 200) -> list[RunEvent]:
    """The last ``tail`` events of a run, or every event after ``after`` (oldest first)."""
    qs = RunEvent.objects.filter(run=run)
    if after is not None:
        return list(qs.filter(seq__gt=after).order_by("seq")[:1000])
    return list(reversed(qs.order_by("-seq")[:tail]))


# --- approvals --------------------------------------------------------------------------------------

# Approvals still waiting for the board (upstream lifecycle: a revision request waits for a resubmit).
APPROVAL_OPEN_STATUSES = ("pending", "revision_requested")


def approval_list(*, company, status: str | None = None):
    """The company's approvals, open ones first (pending, then revision requested), newest first."""
    from django.db.models import Case, IntegerField, Prefetch, Value, When

    from issues.models import ApprovalIssue

    qs = Approval.objects.filter(company=company)
    if status:
        qs = qs.filter(status=status)
    rank = Case(When(status="pending", then=Value(0)), When(status="revision_requested", then=Value(1)),
                default=Value(2), output_field=IntegerField())
    links = Prefetch("issue_links", queryset=ApprovalIssue.objects.order_by("created_at", "id"))
    return (qs.select_related("requested_by_agent", "requested_by_user", "decided_by_user")
            .prefetch_related(links).annotate(open_rank=rank).order_by("open_rank", "-created_at", "id"))


def approval_issues(approval: Approval) -> list[Issue]:
    """The linked issues in the order they were linked (the first one is the approval's task)."""
    return list(Issue.objects.filter(approval_links__approval=approval).select_related(*ISSUE_RELATED)
                .prefetch_related("labels").order_by("approval_links__created_at", "approval_links__id"))


def issue_approvals(issue: Issue) -> list[Approval]:
    """The approvals linked to an issue, in the order they were linked."""
    return list(Approval.objects.filter(issue_links__issue=issue).prefetch_related("issue_links")
                .order_by("issue_links__created_at", "issue_links__id"))


def approval_history(approval: Approval):
    """The approval's audit rows (created, decided, resubmitted), oldest first."""
    from issues.models import ActivityLog

    return (ActivityLog.objects.filter(company_id=approval.company_id, entity_type="approval",
                                       entity_id=str(approval.pk))
            .select_related("actor_agent", "actor_user").order_by("created_at", "id"))


def issue_awaiting_approval(issue: Issue) -> bool:
    """A pending or revision-requested approval is linked to the issue (§9.1.3: keeps dispatch waiting)."""
    return Approval.objects.filter(issue_links__issue=issue, status__in=APPROVAL_OPEN_STATUSES).exists()


# --- pending wakes and run lists (issue #13: a pending wake is observable) -------------------------

WAKE_LIST_LIMIT = 100  # pending wakes / live runs shown to one agent
LIVE_RUNS_LIMIT = 500  # a company's live runs (agents x concurrency; bounded anyway)
RUN_LIST_DEFAULT_LIMIT, RUN_LIST_MAX_LIMIT = 200, 1000  # upstream heartbeat-runs bounds


def agent_pending_wakes(*, agent) -> list:
    """The agent's wakes that have not started: queued, deferred behind another run's lock, or
    claimed by a run that is still queued / waiting for its retry. Newest first, one query."""
    from issues.choices import RunStatus, WakeStatus
    from issues.models import WakeupRequest

    waiting = Q(status__in=(WakeStatus.QUEUED, WakeStatus.DEFERRED_ISSUE_EXECUTION)) | Q(
        status=WakeStatus.CLAIMED, run__status__in=(RunStatus.QUEUED, RunStatus.SCHEDULED_RETRY))
    return list(WakeupRequest.objects.filter(agent=agent).filter(waiting).order_by("-created_at", "-id")
                [:WAKE_LIST_LIMIT])


def agent_live_runs(*, agent) -> list[HeartbeatRun]:
    """The agent's queued, scheduled-retry and running runs, newest first, one query."""
    from issues.choices import LIVE_RUN_STATUSES

    return runs_with_pending_wakes(list(HeartbeatRun.objects.filter(agent=agent, status__in=LIVE_RUN_STATUSES)
                                        .order_by("-created_at", "-id")[:WAKE_LIST_LIMIT]))


def company_runs(*, company, params) -> list[HeartbeatRun]:
    """``GET /companies/{id}/heartbeat-runs?agentId=&limit=``: newest first, ``limit`` 1-1000
    (default 200). The context is not loaded (packets can be large); its ``wakeReasons`` is."""
    from django.db.models.fields.json import KeyTransform

    limit = RUN_LIST_DEFAULT_LIMIT
    if params.get("limit") is not None:
        limit = bounded_int(params["limit"], "limit", minimum=1, maximum=RUN_LIST_MAX_LIMIT)
    qs = HeartbeatRun.objects.filter(company=company)
    if params.get("agentId"):
        agent_id = _uuid_or_error(params["agentId"], "agentId")
        if not Agent.objects.filter(pk=agent_id, company=company).exists():
            # Another company's agent is a 404 like any other foreign id (never an empty page).
            raise NotFound("Agent not found.", details={"agentId": ["No such agent in this company."]})
        qs = qs.filter(agent_id=agent_id)
    return list(qs.defer("context").annotate(wake_reasons=KeyTransform("wakeReasons", "context"))
                .order_by("-created_at", "-id")[:limit])


def issue_runs(*, issue: Issue, params) -> list[HeartbeatRun]:
    """``GET /issues/{id}/runs``: the runs woken for the issue and those that wrote to it (audit
    rows naming both), newest first, bounded like the company's run list. One query."""
    from django.db.models.fields.json import KeyTransform

    from issues.models import ActivityLog

    limit = RUN_LIST_DEFAULT_LIMIT
    if params.get("limit") is not None:
        limit = bounded_int(params["limit"], "limit", minimum=1, maximum=RUN_LIST_MAX_LIMIT)
    wrote = ActivityLog.objects.filter(company_id=issue.company_id, entity_type="issue", entity_id=str(issue.pk),
                                       run__isnull=False).values("run_id")
    return list(HeartbeatRun.objects.filter(company_id=issue.company_id)
                .filter(Q(issue=issue) | Q(pk__in=wrote)).defer("context")
                .annotate(wake_reasons=KeyTransform("wakeReasons", "context"))
                .order_by("-created_at", "-id")[:limit])


def company_live_runs(*, company) -> list[HeartbeatRun]:
    """``GET /companies/{id}/live-runs``: queued and running runs with their agent's name, one query."""
    from issues.choices import RunStatus

    return list(HeartbeatRun.objects.filter(company=company, status__in=(RunStatus.QUEUED, RunStatus.RUNNING))
                .select_related("agent").only(
                    "id", "status", "invocation_source", "started_at", "finished_at", "created_at", "agent_id",
                    "agent__name", "adapter_type", "issue_id")
                .order_by("-created_at", "-id")[:LIVE_RUNS_LIMIT])


def approval_comment_list(*, approval: Approval, params):
    """``GET /approvals/{id}/comments``: oldest first, one query, bounded by ``limit``/``offset``."""
    from issues.models import ApprovalComment

    limit, offset = list_window(params)
    return ApprovalComment.objects.filter(approval=approval).order_by("created_at", "id")[offset: offset + limit]


# --- agents and runs, upstream-compatible (issue #14, paperclip-api.md §5.1) -----------------------

INBOX_LITE_STATUSES = ("todo", "in_progress", "in_review", "blocked")  # upstream's newer inbox set
RUN_ISSUES_LIMIT = 1000  # distinct issues listed for one run
ISSUE_BRIEF_FIELDS = ("id", "identifier", "title", "status", "priority", "priority_rank", "number", "company_id")


def agent_list(*, company, params):
    """``GET /companies/{id}/agents``: the AgentFilterSet's query by name, bounded by limit/offset."""
    from issues.filtersets import AgentFilterSet

    filterset = AgentFilterSet(data=params, queryset=Agent.objects.filter(company=company).order_by("name", "id"))
    if not filterset.is_valid():
        raise InvalidInput("Invalid filter.", code="invalid_filter", details=filterset.errors)
    limit, offset = list_window(params)
    return filterset.qs[offset: offset + limit]


def org_tree(*, company) -> list[dict]:
    """``GET /companies/{id}/org`` (upstream's lean org chart): the company's agents but the terminated
    as nested ``{id, name, role, status, reports}`` nodes, by name; an agent whose manager is
    terminated (or gone) is a root. One query."""
    from issues.choices import AgentStatus

    rows = list(Agent.objects.filter(company=company).exclude(status=AgentStatus.TERMINATED)
                .order_by("name", "id").values("id", "name", "role", "status", "reports_to_id"))
    nodes = {row["id"]: {"id": str(row["id"]), "name": row["name"], "role": row["role"], "status": row["status"],
                         "reports": []} for row in rows}
    roots = []
    for row in rows:
        manager = nodes.get(row["reports_to_id"])
        (manager["reports"] if manager is not None else roots).append(nodes[row["id"]])
    placed = set()

    def place(node):
        stack = [node]
        while stack:
            node = stack.pop()
            placed.add(node["id"])
            stack.extend(node["reports"])

    for root in roots:
        place(root)
    for row in rows:  # left over: a reporting cycle (the services refuse them); cut it so all are shown
        node = nodes[row["id"]]
        if node["id"] not in placed:
            manager = nodes[row["reports_to_id"]]
            manager["reports"] = [n for n in manager["reports"] if n is not node]  # by identity: a cycle
            roots.append(node)
            place(node)
    return roots


def agent_get(*, actor: Actor, pk) -> Agent:
    return scoped_get(Agent.objects.all(), actor, pk, "Agent")


def agent_detail(*, actor: Actor, pk) -> Agent:
    """The agent with ``chain_of_command`` (manager first, up to the top)."""
    agent = scoped_get(Agent.objects.select_related("reports_to"), actor, pk, "Agent")
    agent.chain_of_command = chain_of_command(agent)
    return agent


def agent_inbox_lite(*, agent, params):
    """``GET /agents/me/inbox-lite``: the agent's actionable issues with their execution run, one
    query: most urgent first, then most recently updated."""
    limit, offset = list_window(params)
    return (Issue.objects.filter(company_id=agent.company_id, assignee_agent=agent, status__in=INBOX_LITE_STATUSES)
            .select_related("execution_run")
            .only(*ISSUE_BRIEF_FIELDS, "project_id", "goal_id", "parent_id", "updated_at", "execution_run__id",
                  "execution_run__status", "execution_run__agent_id", "execution_run__started_at")
            .order_by("priority_rank", "-updated_at", "id")[offset: offset + limit])


MINE_STATUSES = "backlog,todo,in_progress,in_review,blocked,done"  # upstream's default for the Mine view


def agent_mine_inbox(*, agent, params) -> list[Issue]:
    """``GET /agents/me/inbox/mine?userId=``: the issues a board member of the agent's company
    created, was assigned or commented on (the list's ``touchedByUserId``), with the list's filters
    (``status`` defaults to MINE_STATUSES), order and paging (``issue_list``). Each issue carries the
    member's last touch and the last comment by anyone else (``my_created_at``, ``my_last_comment_at``,
    ``last_external_comment_at``)."""
    from django.db.models import Case, OuterRef, Subquery, When

    from issues.models import Membership

    raw = str(params.get("userId") or "").strip()
    if not raw:
        raise InvalidInput(details={"userId": ["Required: the board member whose Mine inbox to read."]})
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 18) or not Membership.objects.filter(
            company_id=agent.company_id, user_id=int(raw)).exists():
        raise NotFound("User not found.", details={"userId": ["No such member of this company."]})
    user_id = int(raw)
    query = params.copy()
    query["touchedByUserId"] = str(user_id)
    query.setdefault("status", MINE_STATUSES)
    comments = Comment.objects.filter(issue=OuterRef("pk")).order_by("-created_at").values("created_at")
    return issue_list(company=agent.company, params=query, annotations={
        "my_created_at": Case(When(created_by_user_id=user_id, then="created_at")),
        "my_last_comment_at": Subquery(comments.filter(author_user_id=user_id)[:1]),
        "last_external_comment_at": Subquery(comments.exclude(author_user_id=user_id)[:1])})


def heartbeat_run_get(*, actor: Actor, pk) -> HeartbeatRun:
    """A run of the actor's company (any agent's): upstream's ``/heartbeat-runs/{id}`` scope."""
    return scoped_get(HeartbeatRun.objects.all(), actor, pk, "Heartbeat run")


def run_touched_issues(*, run: HeartbeatRun) -> list[Issue]:
    """Issues the run wrote to (checked out, commented, changed: the audit rows made from it) and
    the issue it was woken for; at most RUN_ISSUES_LIMIT, by number. Two queries."""
    from issues.models import ActivityLog

    ids = {run.issue_id} if run.issue_id else set()
    for entity_id in (ActivityLog.objects.filter(run=run, entity_type="issue").order_by()
                      .values_list("entity_id", flat=True).distinct()[:RUN_ISSUES_LIMIT]):
        try:
            ids.add(uuid.UUID(entity_id))
        except ValueError:
            continue
    if not ids:
        return []
    return list(Issue.objects.filter(company_id=run.company_id, pk__in=ids).only(*ISSUE_BRIEF_FIELDS)
                .order_by("number")[:RUN_ISSUES_LIMIT])


def issue_live_runs(*, issue: Issue) -> list[HeartbeatRun]:
    """``GET /issues/{id}/live-runs``: the issue's queued and running runs, newest first, one query."""
    from issues.choices import RunStatus

    return list(HeartbeatRun.objects.filter(issue=issue, status__in=(RunStatus.QUEUED, RunStatus.RUNNING))
                .select_related("agent").defer("context").order_by("-created_at", "-id")[:LIVE_RUNS_LIMIT])


def issue_active_run(*, issue: Issue) -> HeartbeatRun | None:
    """``GET /issues/{id}/active-run``: the run holding the issue's execution lock while it is
    queued or running, else the issue's newest running run, else None."""
    from issues.choices import RunStatus

    runs = HeartbeatRun.objects.select_related("agent")
    if issue.execution_run_id:
        run = runs.filter(pk=issue.execution_run_id, status__in=(RunStatus.QUEUED, RunStatus.RUNNING)).first()
        if run is not None:
            return run
    return runs.filter(issue=issue, status=RunStatus.RUNNING).order_by("-created_at", "-id").first()


# --- issue extras (issue #14): children and labels --------------------------------------------------


def issue_children(*, issue: Issue, params, actor: Actor | None = None):
    """``GET /issues/{id}/children``: the issue list (same filters, order and paging) of its direct children."""
    params = params.copy()
    params["parentId"] = str(issue.pk)
    params.pop("parentIssueId", None)
    return issue_list(company=issue.company, params=params, actor=actor)


def label_list(*, company, params):
    """The company's labels by name, one query, bounded by ``limit``/``offset``."""
    from issues.models import Label

    limit, offset = list_window(params)
    return Label.objects.filter(company=company).order_by("name", "id")[offset: offset + limit]


def label_get(*, actor: Actor, pk):
    from issues.models import Label

    return scoped_get(Label.objects.all(), actor, pk, "Label")


# --- #14 org: goals, projects, costs, dashboard, activity (paperclip-api.md §5.4-§5.8) -------------

DASHBOARD_DAYS = 14  # runActivity / issueActivity: the last 14 UTC days, today included
DASHBOARD_RECENT_ISSUES = 50  # upstream's recentIssues bound


def _filtered_window(filterset_class, params, queryset, company_id=None):
    """A FilterSet's query bounded by limit/offset; an invalid filter is a 400 naming it; with
    ``company_id``, filter ids naming no object of the company are a 404 (refs_checked)."""
    filterset = filterset_class(data=params, queryset=queryset)
    if not filterset.is_valid():
        raise InvalidInput("Invalid filter.", code="invalid_filter", details=filterset.errors)
    limit, offset = list_window(params)
    page = filterset.qs[offset: offset + limit]
    return page if company_id is None else refs_checked(filterset, company_id, list(page))


def goal_list(*, company, params):
    """``GET /companies/{id}/goals``: oldest first, one query."""
    from issues.filtersets import GoalFilterSet
    from issues.models import Goal

    return _filtered_window(GoalFilterSet, params, Goal.objects.filter(company=company).order_by("created_at", "id"),
                            company.pk)


def goal_get(*, actor: Actor, pk):
    from issues.models import Goal

    return scoped_get(Goal.objects.all(), actor, pk, "Goal")


def project_list(*, company, params):
    """``GET /companies/{id}/projects``: by name, one query."""
    from issues.filtersets import ProjectFilterSet
    from issues.models import Project

    return _filtered_window(ProjectFilterSet, params,
                            Project.objects.filter(company=company).prefetch_related("goals").order_by("name", "id"))


def project_get(*, actor: Actor, pk):
    from issues.models import Project

    return scoped_get(Project.objects.prefetch_related("goals"), actor, pk, "Project")


def issue_activity(*, issue: Issue, params):
    """``GET /issues/{id}/activity``: the audit rows about the issue, newest first, one query,
    bounded by limit/offset and narrowed by the activity list's filters."""
    from issues.filtersets import ActivityFilterSet
    from issues.models import ActivityLog

    rows = ActivityLog.objects.filter(company_id=issue.company_id, entity_type="issue", entity_id=str(issue.pk))
    return _filtered_window(ActivityFilterSet, params, rows.order_by("-created_at", "-id"), issue.company_id)


def activity_list(*, company, params):
    """``GET /companies/{id}/activity``: newest first, one query, bounded by limit/offset."""
    from issues.filtersets import ActivityFilterSet
    from issues.models import ActivityLog

    return _filtered_window(ActivityFilterSet, params,
                            ActivityLog.objects.filter(company=company).order_by("-created_at", "-id"), company.pk)


def company_stats(*, actor: Actor) -> dict:
    """``GET /companies/stats`` (upstream, board only): ``{companyId: {agentCount, issueCount}}`` for
    each of the caller's companies (with zeros, where upstream leaves an empty company out). Two
    queries after the caller's companies."""
    from django.db.models import Count

    actor.ensure_board()
    ids = list(actor.company_ids)
    agents = dict(Agent.objects.filter(company_id__in=ids).values("company_id").annotate(n=Count("id"))
                  .values_list("company_id", "n"))
    issues = dict(Issue.objects.filter(company_id__in=ids).values("company_id").annotate(n=Count("id"))
                  .values_list("company_id", "n"))
    return {str(pk): {"agentCount": agents.get(pk, 0), "issueCount": issues.get(pk, 0)} for pk in ids}


def org_dashboard(*, company, now=None) -> dict:
    """``GET /companies/{id}/dashboard`` (upstream's shape): eight queries whatever the company's size."""
    from datetime import datetime, timedelta, timezone as dt_timezone

    from django.db.models import Count, Sum
    from django.db.models.functions import TruncDate
    from django.utils import timezone

    from issues.cost_reports import percent
    from issues.models import CostEvent
    from issues.services.company_stop import COMPANY_BUDGET
    from issues.services.costs import BUDGET_STOP
    from issues.services.periods import month_start

    now = now or timezone.now()
    today = now.astimezone(dt_timezone.utc).date()
    days = [today - timedelta(days=n) for n in range(DASHBOARD_DAYS - 1, -1, -1)]
    since = datetime.combine(days[0], datetime.min.time(), tzinfo=dt_timezone.utc)
    by_day = TruncDate("created_at", tzinfo=dt_timezone.utc)

    agents = {"active": 0, "running": 0, "paused": 0, "error": 0}
    budget_stopped = 0
    for status, n, stopped in (Agent.objects.filter(company=company).values("status").order_by()
                               .annotate(n=Count("id"), stopped=Count("id", filter=Q(
                                   pause_reason__in=(BUDGET_STOP, COMPANY_BUDGET))))
                               .values_list("status", "n", "stopped")):
        bucket = "active" if status == "idle" else status  # idle agents are operational (upstream)
        if bucket in agents:
            agents[bucket] += n
        budget_stopped += stopped
    tasks = {"open": 0, "inProgress": 0, "blocked": 0, "done": 0}
    for status, n in (Issue.objects.filter(company=company).values("status").order_by().annotate(n=Count("id"))
                      .values_list("status", "n")):
        tasks["open"] += n if status not in TERMINAL_ISSUE_STATUSES else 0
        key = {"in_progress": "inProgress", "blocked": "blocked", "done": "done"}.get(status)
        if key:
            tasks[key] += n
    approvals = Approval.objects.filter(company=company, status="pending").aggregate(
        pending=Count("id"), budget=Count("id", filter=Q(type="budget_override_required")))
    spend = (CostEvent.objects.filter(company=company, occurred_at__gte=month_start(now))
             .aggregate(s=Sum("cost_cents"))["s"] or 0)

    runs = {day: {"date": day.isoformat(), "succeeded": 0, "failed": 0, "other": 0, "total": 0} for day in days}
    for day, status, n in (HeartbeatRun.objects.filter(company=company, created_at__gte=since)
                           .annotate(day=by_day).values("day", "status").order_by().annotate(n=Count("id"))
                           .values_list("day", "status", "n")):
        bucket = runs.get(day)
        if bucket is None:
            continue
        kind = "succeeded" if status == "succeeded" else "failed" if status in ("failed", "timed_out") else "other"
        bucket[kind] += n
        bucket["total"] += n
    issues = {day: {"date": day.isoformat(), "total": 0, "byPriority": {}, "byStatus": {}} for day in days}
    for day, priority, status, n in (Issue.objects.filter(company=company, created_at__gte=since)
                                     .annotate(day=by_day).values("day", "priority", "status").order_by()
                                     .annotate(n=Count("id")).values_list("day", "priority", "status", "n")):
        bucket = issues.get(day)
        if bucket is None:
            continue
        bucket["total"] += n
        bucket["byPriority"][priority] = bucket["byPriority"].get(priority, 0) + n
        bucket["byStatus"][status] = bucket["byStatus"].get(status, 0) + n
    recent = list(Issue.objects.filter(company=company).order_by("-updated_at", "-id").only(
        "id", "identifier", "title", "status", "priority", "project_id", "parent_id", "assignee_agent_id",
        "created_at", "updated_at")[:DASHBOARD_RECENT_ISSUES])
    budget = company.budget_monthly_cents
    return {
        "companyId": str(company.pk), "agents": agents, "tasks": tasks,
        "costs": {"monthSpendCents": spend, "monthBudgetCents": budget,
                  "monthUtilizationPercent": percent(spend, budget)},
        "pendingApprovals": approvals["pending"],
        # No budget incidents or project pauses here: an incident is an agent stopped by its own
        # budget or by the company's.
        "budgets": {"activeIncidents": budget_stopped, "pendingApprovals": approvals["budget"],
                    "pausedAgents": budget_stopped, "pausedProjects": 0},
        "runActivity": list(runs.values()), "issueActivity": list(issues.values()), "recentIssues": recent,
        "alerts": operator_alerts(company),  # registered by apps that depend on issues (connectors)
    }


# --- #14 auth: board API keys -------------------------------------------------------------------------
def board_key_list(*, user, params):
    """``GET /board-api-keys``: the user's own keys, newest first, one query."""
    from issues.filtersets import BoardApiKeyFilterSet
    from issues.models import BoardApiKey

    filterset = BoardApiKeyFilterSet(data=params, queryset=BoardApiKey.objects.filter(user=user).order_by(
        "-created_at", "-id"))
    if not filterset.is_valid():
        raise InvalidInput("Invalid filter.", code="invalid_filter", details=filterset.errors)
    limit, offset = list_window(params)
    return filterset.qs[offset: offset + limit]


# --- #14 issue extras: one comment ----------------------------------------------------------------------
def comment_get(*, issue: Issue, pk) -> Comment:
    """``GET /issues/{id}/comments/{commentId}``: a comment of this issue only (another issue's is a 404)."""
    try:
        return Comment.objects.select_related("author_agent", "author_user").get(issue=issue, pk=pk)
    except (Comment.DoesNotExist, ValidationError, ValueError):
        raise NotFound("Comment not found")


def agent_key_list(*, agent, params):
    """``GET /agents/{id}/keys``: the agent's long-lived keys, revoked ones too (upstream shows
    ``revokedAt``), newest first, one query. Run-scoped keys die with their run and are not listed."""
    from issues.models import AgentApiKey

    limit, offset = list_window(params)
    return AgentApiKey.objects.filter(agent=agent, run__isnull=True).order_by("-created_at", "-id")[
        offset: offset + limit]
