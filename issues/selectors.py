"""Reads shared by the API, the console and the templates. Everything is company-scoped."""
import re
import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import Q

from issues.actors import Actor
from issues.choices import TERMINAL_ISSUE_STATUSES
from issues.exceptions import InvalidInput, NotFound
from issues.filtersets import IssueFilterSet
from issues.models import Agent, Approval, Comment, Document, HeartbeatRun, Issue, RunEvent

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
    issue.blocked_by = open_blockers(issue)
    return issue


def walk_up(node, attr: str = "parent"):
    """Yield ``node``'s ancestors along ``attr``, nearest first; stops on a cycle."""
    seen = {node.pk}
    node = getattr(node, attr)
    while node is not None and node.pk not in seen:
        yield node
        seen.add(node.pk)
        node = getattr(node, attr)


def ancestors(issue: Issue) -> list[Issue]:
    """Parent chain, nearest first (one query per level; trees are shallow)."""
    return list(walk_up(issue))


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


def issue_filterset(*, company, params) -> IssueFilterSet:
    return IssueFilterSet(
        data=params,
        queryset=Issue.objects.filter(company=company).select_related(*ISSUE_RELATED).order_by(
            "priority_rank", "created_at", "id"
        ),
    )


def issue_list(*, company, params):
    """The inbox / issue list: the FilterSet's query, sorted by priority then age."""
    filterset = issue_filterset(company=company, params=params)
    if not filterset.is_valid():
        raise InvalidInput("Invalid filter.", code="invalid_filter", details=filterset.errors)
    limit, offset = list_window(params)
    return filterset.qs[offset: offset + limit]


def comment_list(*, issue: Issue, params):
    qs = Comment.objects.filter(issue=issue).select_related("author_agent", "author_user").order_by("created_at", "id")
    after = params.get("after")
    if after:
        anchor = Comment.objects.filter(issue=issue, pk=_uuid_or_error(after, "after")).first()
        if anchor is None:
            raise InvalidInput(details={"after": ["No such comment on this issue."]})
        qs = qs.filter(Q(created_at__gt=anchor.created_at) | Q(created_at=anchor.created_at, id__gt=anchor.id))
    limit, _ = list_window(params)
    return qs[:limit]


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
    document = Document.objects.select_related("latest_revision").filter(issue=issue, key=key).first()
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
            "live_runs": live_runs, "pending_interactions": pending, "recent_activity": activity}


def assignable_agents(*, company):
    """Agents a console form may offer for new work: everyone but the terminated, by name."""
    from issues.choices import AgentStatus

    return Agent.objects.filter(company=company).exclude(status=AgentStatus.TERMINATED).order_by("name").only(
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
                .order_by("approval_links__created_at", "approval_links__id"))


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

    return list(HeartbeatRun.objects.filter(agent=agent, status__in=LIVE_RUN_STATUSES)
                .order_by("-created_at", "-id")[:WAKE_LIST_LIMIT])


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


def company_live_runs(*, company) -> list[HeartbeatRun]:
    """``GET /companies/{id}/live-runs``: queued and running runs with their agent's name, one query."""
    from issues.choices import RunStatus

    return list(HeartbeatRun.objects.filter(company=company, status__in=(RunStatus.QUEUED, RunStatus.RUNNING))
                .select_related("agent").only(
                    "id", "status", "invocation_source", "started_at", "finished_at", "created_at", "agent_id",
                    "agent__name", "adapter_type", "issue_id")
                .order_by("-created_at", "-id")[:LIVE_RUNS_LIMIT])
