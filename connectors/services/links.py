"""Task links (§4.1.3, §6): creation with dedupe, snapshots, the status machine, host-side notes."""
from __future__ import annotations

import re
from contextvars import ContextVar
from functools import lru_cache

from django.db import connection, transaction

from connectors.choices import (
    ConflictKind,
    ConflictStatus,
    LinkStatus,
    OriginSide,
    OutboundKind,
    RunMode,
)
from connectors.models import Conflict, ConnectorInstance, LinkTransition, TaskLink
from connectors.providers.base import ExternalTask, normalize_labels
from issues import mentioned_addresses
from issues.actors import SYSTEM
from issues.choices import AuthorType, IssueStatus, OriginKind
from issues.models import Comment, Company, Issue
from issues.services.activity import activity_record
from issues.services.thread import comment_create
from paperclip.core import rows

from . import audit, backlinks, content
from .common import link_set_status

BACKLINK = re.compile(r"<!--\s*paperclip:issue[=:]\s*([0-9a-fA-F-]{36})")
PRIORITY = {0: "critical", 1: "high", 2: "medium", 3: "low", 4: "low"}
INITIAL_STATUS = {"active": IssueStatus.TODO, "blocked": IssueStatus.BLOCKED}


def provider_label(instance: ConnectorInstance) -> str:
    return instance.provider_key


def issue_priority(task: ExternalTask) -> str | None:
    return PRIORITY.get(task.priority) if task.priority is not None else None


def initial_status(category: str) -> str:
    return INITIAL_STATUS.get(category, IssueStatus.BACKLOG)


def external_snapshot(task: ExternalTask, label: str) -> dict:
    return {"title": content.render_title(task), "description": content.render_description(task, label),
            "state": task.state.name, "category": task.state.category, "priority": task.priority,
            "labels": list(task.labels), "assignees": sorted(a.external_user_id for a in task.assignees),
            "customFields": (task.envelope or {}).get("customFields") or {}, "revision": task.revision,
            "updatedAt": task.updated_at.isoformat() if task.updated_at else None}


def paperclip_snapshot(issue: Issue) -> dict:
    return {"title": issue.title, "description": issue.description, "status": issue.status,
            "priority": issue.priority, "assigneeAgentId": str(issue.assignee_agent_id) if issue.assignee_agent_id else None}


def wake_on_comment(link: TaskLink, instance: ConnectorInstance) -> bool:
    if link.run_mode == RunMode.EXTERNAL_OBSERVER:
        return False  # no execution coupling (§4.2.2), whatever wakeOnExternalComment says
    if link.wake_on_external_comment is not None:
        return link.wake_on_external_comment
    if instance.wake_on_external_comment is not None:
        return instance.wake_on_external_comment
    return True




def note(issue: Issue, body: str, *, link: TaskLink | None = None, key: str = "", kind: str = "note") -> Comment:
    """A connector notice in the issue thread (system author: it never wakes anyone)."""
    provenance = {"source": "connector", "kind": kind, "eventKey": key}
    if link is not None:
        provenance.update({"connectorInstanceId": str(link.instance_id), "linkId": str(link.pk),
                           "providerKey": link.provider_key, "externalKey": link.external_key})
    return comment_create(actor=SYSTEM, issue=issue, body=body, provenance=provenance, author_type=AuthorType.SYSTEM,
                          _locked=True)


def dedupe_issue(instance: ConnectorInstance, task: ExternalTask,
                 pairings: backlinks.TaskPairings | None = None) -> tuple[Issue | None, str]:
    """§6.3 steps 2 and 3 (step 1, an active link, is checked by the caller), in the spec's order:
    our backlink (the issue id marker in the description, then the backlink the provider carries:
    services/backlinks.py; ``pairings``: the task's, if the caller read them), then a reference to
    the task on an issue of the company. Never an issue another link of this instance holds."""
    active = TaskLink.objects.filter(instance=instance).exclude(status=LinkStatus.UNLINKED).values("issue_id")
    match = BACKLINK.search(task.description or "")
    if match:
        issue = Issue.objects.filter(company_id=instance.company_id, pk=match.group(1)).exclude(pk__in=active).first()
        if issue is not None:
            return issue, "backlink"
    issue = backlinks.backlinked_issue(instance, task, exclude=active, pairings=pairings)
    if issue is not None:
        return issue, "backlink"
    issue = _referencing_issue(instance, task)
    return (issue, "reference") if issue is not None else (None, "")


@lru_cache(maxsize=3)
def _reference_sql(mentions: str) -> str:
    """``mentions``: "" (the task has no address), "indexed" (the mentions index answers) or "search"
    (LIKE is the cheap filter; the expression decides: mentioned_addresses.mention_pattern).

    "indexed" is a union of two index probes, the mention probe fenced (``OFFSET 0``) from the
    company condition. Written as one OR, the planner may answer both from the company's rows,
    calling the mentions function on each: it does when the statistics are older than the company's
    issues (a burst of imports outruns ANALYZE), and then one lookup costs tens of milliseconds."""
    qn = connection.ops.quote_name
    table = qn(Issue._meta.db_table)

    def origin(alias):
        return f"{alias}.origin_kind = %s AND {alias}.origin_id = %s"

    if mentions == "indexed":
        found = (f"s.id IN (SELECT o.id FROM {table} o WHERE o.company_id = %s AND {origin('o')} "
                 f"UNION ALL SELECT m.id FROM (SELECT i.id, i.company_id FROM {table} i "
                 f"WHERE {mentioned_addresses.indexed_condition('i.description')} OFFSET 0) m "
                 f"WHERE m.company_id = %s)")
    elif mentions == "search":
        found = (f"s.company_id = %s AND ({origin('s')} OR (s.description {connection.operators['contains'] % '%s'} "
                 f"AND s.description {connection.operators['regex'] % '%s'}))")
    else:
        found = f"s.company_id = %s AND {origin('s')}"
    return (f"SELECT {rows.select_list(Issue, 's')} FROM {table} s WHERE {found} AND NOT EXISTS "
            f"(SELECT 1 FROM {qn(TaskLink._meta.db_table)} l WHERE l.issue_id = s.id AND l.instance_id = %s "
            f"AND l.status <> {rows.constant(LinkStatus.UNLINKED)}) ORDER BY s.created_at, s.id LIMIT 1")


def _referencing_issue(instance: ConnectorInstance, task: ExternalTask) -> Issue | None:
    """§6.3 step 3: the oldest issue of the company that an import of this task made or whose
    description mentions the task's address, and that no live link of this instance holds. A
    statement built once (every import asks). The origin and, on PostgreSQL, the mention are index
    probes (issue_origin_idx, issue_mentioned_addresses_idx), and the "held" check probes the
    candidates' links by index, so it grows neither with the company's issues nor with the
    instance's links."""
    company = rows.pk_value(Company, instance.company_id)
    params = [company, OriginKind.CONNECTOR, content.attribution_key(instance.pk, task.external_id)]
    mentions = ""
    if task.url and mentioned_addresses.indexed(task.url, connection.vendor):
        mentions = "indexed"
        params += [task.url, company]
    elif task.url:
        mentions = "search"
        params += [f"%{connection.ops.prep_for_like_query(task.url)}%", mentioned_addresses.mention_pattern(task.url)]
    params.append(rows.pk_value(ConnectorInstance, instance.pk))
    # Planned on every run: a burst of imports grows the company faster than its statistics, and a
    # generic plan settled on early scans every issue (measured: 9 imports/s at 5,000, 0.15 ms planned).
    with rows.unprepared():
        return rows.fetch_one(Issue, _reference_sql(mentions), params)[0]


def link_create(*, instance: ConnectorInstance, issue: Issue, task: ExternalTask, origin_side: str, key: str,
                routing: dict | None = None, cause: str, status: str = LinkStatus.PENDING,
                link_id=None) -> TaskLink:
    """``status=healthy`` when the first sync commits with the creation (an import): the link is
    never observably pending, so it is born healthy with one transition. ``link_id``: the id the
    caller already attributed earlier writes to (an import creates the issue first)."""
    label = provider_label(instance)
    link = rows.insert(TaskLink(
        **({"id": link_id} if link_id else {}),
        company_id=instance.company_id, instance=instance, provider_key=instance.provider_key,
        project_id=issue.project_id, goal_id=issue.goal_id, issue=issue,
        external_project_id=task.container_id or "", external_task_id=task.external_id,
        external_key=task.external_key or "", external_url=task.url or "", external_title=task.title[:500],
        external_state_name=task.state.name[:200], external_state_category=task.state.category,
        external_updated_at=task.updated_at, origin_side=origin_side, sync_mode=instance.default_sync_mode,
        run_mode=instance.default_run_mode, field_policy=dict(instance.field_policy or {}),
        base_snapshot={"external": external_snapshot(task, label), "paperclip": paperclip_snapshot(issue)},
        last_external_revision=task.revision, routing=routing or {}, envelope=dict(task.envelope or {}),
        status=status,
    ))
    rows.insert(LinkTransition(link=link, from_status="", to_status=status, cause=cause, idempotency_key=key[:300]))
    audit.link_bound(link)  # the rest of the event's audit rows name it (§14.5)
    return link


def conflict_open(*, link: TaskLink, kind: str, field: str = "", detail: str = "", base=None, external=None,
                  paperclip=None, actors: dict | None = None, key: str = "") -> tuple[Conflict, bool]:
    """Open (or find the open) conflict of this kind/field and move the link to ``conflict``."""
    with transaction.atomic():
        existing = Conflict.objects.filter(link=link, kind=kind, field=field, status=ConflictStatus.OPEN).first()
        if existing is not None:
            return existing, False
        conflict = Conflict.objects.create(
            company_id=link.company_id, instance_id=link.instance_id, link=link, kind=kind, field=field,
            detail=detail[:500], base_value=base, external_value=external, paperclip_value=paperclip,
            actors=actors or {})
        if link.status != LinkStatus.PAUSED:
            link_set_status(link, LinkStatus.CONFLICT, f"{kind} conflict: {detail}"[:300], detail=detail[:500], key=key)
        activity_record(actor=SYSTEM, company_id=link.company_id, action="connector.conflict_opened",
                        entity_type="connector_link", entity_id=link.pk,
                        details={"conflictId": str(conflict.pk), "kind": kind, "field": field, "detail": detail,
                                 "eventKey": key, "instanceId": str(link.instance_id)})
    return conflict, True


# The conflict entries being resolved right now, as (conflict id, link id, field), set by
# conflicts.conflict_resolve: the writes a resolution makes are that resolution, so they neither "settle"
# the entry nor count as a new Paperclip edit of the field (policy_entries.py).
RESOLVING: ContextVar[frozenset] = ContextVar("connector_conflicts_resolving", default=frozenset())


def resolving(link_id, field: str) -> bool:
    """Whether a resolution of a conflict on this link and field is what is writing it now."""
    return any(lid == link_id and f == field for _, lid, f in RESOLVING.get())


def conflict_settle(*, link: TaskLink, kind: str, field: str = "", resolution: str, key: str = "") -> bool:
    """Close the open conflict of this kind/field that a later change made moot (a route that resolves
    again, a Paperclip edit that now equals the tracker's value): resolved with ``resolution``, audited,
    and the link leaves ``conflict`` when no open entry remains. Returns whether one was open."""
    from django.utils import timezone

    with transaction.atomic():
        ids = list(Conflict.objects.filter(link=link, kind=kind, field=field, status=ConflictStatus.OPEN)
                   .exclude(pk__in=[pk for pk, _, _ in RESOLVING.get()]).values_list("pk", flat=True))
        if not ids:
            return False
        Conflict.objects.filter(pk__in=ids).update(status=ConflictStatus.RESOLVED, resolution=resolution[:32],
                                                   resolved_at=timezone.now())
        if link.status == LinkStatus.CONFLICT and not Conflict.objects.filter(
                link=link, status=ConflictStatus.OPEN).exists():
            link_set_status(link, LinkStatus.HEALTHY, f"{kind} conflict settled ({resolution})", detail="", key=key)
        activity_record(actor=SYSTEM, company_id=link.company_id, action="connector.conflict_settled",
                        entity_type="connector_link", entity_id=link.pk,
                        details={"conflictIds": [str(pk) for pk in ids], "kind": kind, "field": field,
                                 "resolution": resolution, "eventKey": key, "instanceId": str(link.instance_id)})
    return True


def deletion_handle(*, link: TaskLink, issue: Issue, actor_text: str, key: str, what: str = "deleted") -> bool:
    """§6.4: never delete or cancel the issue; a deletion conflict, a note, and the link in conflict."""
    detail = f"external task {what}"
    _, created = conflict_open(link=link, kind=ConflictKind.DELETION, detail=detail,
                               external={"deleted": True}, paperclip={"status": issue.status},
                               actors={"external": actor_text}, key=key)
    if created:
        note(issue, f"The linked external task {link.external_key or link.external_task_id} was {what} by "
                    f"{actor_text}. This issue is kept as it is: continue, unlink, or cancel it yourself.",
             link=link, key=key, kind="deletion")
    return created


def backlink_record(*, link: TaskLink, instance: ConnectorInstance, issue: Issue):
    from .outbound import effect_record, issue_url, write_refusal  # outbound builds on this module

    if not write_refusal(link, OutboundKind.BACKLINK, toggle="postBacklink"):
        effect_record(link=link, kind=OutboundKind.BACKLINK, source_id=str(issue.pk), payload={"url": issue_url(issue)})


def link_manual(*, actor, instance: ConnectorInstance, issue: Issue, task: ExternalTask, key: str) -> TaskLink:
    """§6.2 manual link: pair an existing external task and an existing issue. The base snapshot is
    computed from both sides; where they differ, a conflict is queued instead of picking a winner."""
    from django.db import IntegrityError

    from issues.exceptions import Conflict as ConflictError

    label = provider_label(instance)
    try:
        with transaction.atomic():
            link = link_create(instance=instance, issue=issue, task=task, key=key, origin_side=OriginSide.MANUAL_LINK,
                               cause="manual link")
    except IntegrityError:
        raise ConflictError("The issue or the external task already has an active link on this connector.",
                            code="already_linked", details={"issueId": [str(issue.pk)],
                                                           "externalTaskId": [task.external_id]})
    diverged = pair_check(link=link, issue=issue, task=task, label=label, key=key, at="manual link")
    backlink_record(link=link, instance=instance, issue=issue)  # §12.4, and what a later dedupe finds (§6.3)
    activity_record(actor=actor, company_id=link.company_id, action="connector.link_created",
                    entity_type="connector_link", entity_id=link.pk,
                    details={"instanceId": str(instance.pk), "issueId": str(issue.pk), "originSide": "manual_link",
                             "externalTaskId": task.external_id, "externalKey": task.external_key,
                             "idempotencyKey": key, "divergedFields": diverged})
    return link


def link_existing(*, instance: ConnectorInstance, issue: Issue, task: ExternalTask, key: str,
                  how: str) -> tuple[TaskLink, list[str]]:
    """The §6.3 dedupe found ``issue`` for the task (``how``: backlink / reference): no issue is
    created; the two existing records are paired as a manual link (§6.2.3: origin ``manual_link``,
    both sides compared, divergence surfaced as conflicts). A pairing this company had before (an
    unlink, another instance) keeps its field policy. Returns the link and the diverged fields."""
    previous = (TaskLink.objects.filter(company_id=instance.company_id, provider_key=instance.provider_key,
                                        issue=issue, external_task_id=task.external_id)
                .order_by("-created_at").values_list("field_policy", flat=True).first())
    link = link_create(instance=instance, issue=issue, task=task, key=key, origin_side=OriginSide.MANUAL_LINK,
                       cause=f"linked to existing issue by {how} (dedupe)")
    if previous is not None and previous != link.field_policy:
        link.field_policy = dict(previous)
        link.save(update_fields=["field_policy", "updated_at"])
    diverged = pair_check(link=link, issue=issue, task=task, label=provider_label(instance), key=key,
                          at=f"dedupe by {how}")
    if how != "backlink":
        backlink_record(link=link, instance=instance, issue=issue)  # the task does not point here yet
    return link, diverged


# External category -> the issue statuses that agree with it (an imported active task is todo until
# checked out; Linear's unstarted "Todo" maps to backlog by default).
AGREEING_STATUSES = {"backlog": {IssueStatus.BACKLOG, IssueStatus.TODO},
                     "active": {IssueStatus.TODO, IssueStatus.IN_PROGRESS},
                     "review": {IssueStatus.IN_REVIEW}, "blocked": {IssueStatus.BLOCKED},
                     "terminal": {IssueStatus.DONE, IssueStatus.CANCELLED}}


def divergences(issue: Issue, task: ExternalTask, label: str) -> list[tuple[str, object, object]]:
    """§6.2.3: the synced fields on which the issue and the task disagree, as (field, Paperclip value,
    external value) in the vocabulary of the base snapshot and conflict resolution: title and
    description (as an import renders them), priority (when the tracker has one), labels (when the
    issue carries any: Paperclip never takes labels from a tracker), the state (the issue status
    against the task's category). ``dueAt`` has no Paperclip counterpart and cannot diverge."""
    ext = external_snapshot(task, label)
    found = [(field, getattr(issue, field), ext[field]) for field in ("title", "description")
             if getattr(issue, field) != ext[field]]
    priority = issue_priority(task)
    if priority is not None and issue.priority != priority:
        found.append(("priority", issue.priority, task.priority))
    names = list(issue.labels.values_list("name", flat=True))
    if names and sorted(normalize_labels(names)) != sorted(task.labels):
        found.append(("labels", sorted(names), list(task.labels)))
    category = task.state.category
    if issue.status not in AGREEING_STATUSES.get(category, ()):
        found.append(("state", issue.status, category))
    return found


def pair_check(*, link: TaskLink, issue: Issue, task: ExternalTask, label: str, key: str, at: str) -> list[str]:
    """Compare a new pairing of existing records: one field conflict per divergent field (the link in
    ``conflict``), else the link is healthy. Returns the diverged fields."""
    diverged = divergences(issue, task, label)
    for field, paperclip_value, external_value in diverged:
        conflict_open(link=link, kind=ConflictKind.FIELD, field=field, detail=f"{field} differs at {at}",
                      base=None, external=external_value, paperclip=paperclip_value, key=key)
    if not diverged:
        link_set_status(link, LinkStatus.HEALTHY, f"{at}: both sides agree", detail="", key=key)
    return [d[0] for d in diverged]
