"""Issue creation and updates, including the two-level agent task tree (seed 004)."""
from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from issues import events
from issues.actors import Actor
from issues.choices import (
    PRIORITY_RANK,
    TERMINAL_ISSUE_STATUSES,
    IssuePriority,
    IssueStatus,
    OriginKind,
    RelationKind,
    WakeSource,
)
from issues.exceptions import BlockedByOpenIssues, Conflict, Forbidden, InvalidInput, Unprocessable
from issues.models import Agent, Company, Goal, Issue, IssueRelation, Project
from issues.selectors import open_blockers, walk_up
from issues.workspaces.service import new_issue_workspace_fields
from paperclip.core import rows

from .activity import activity_record
from .agent_grants import ensure_may_assign
from .deletion import unless_held
from .fences import ensure_may_change, ensure_owning_run
from .labels import labels_resolve
from .lookups import agent_ref_id, assignable_agent, assignable_user, company_object
from .wake_triggers import ISSUE_ASSIGNED, issue_became_terminal
from .wakeups import wake_assignee

LOCK_FIELDS = {"checkout_run": None, "execution_run": None, "execution_locked_at": None, "checkout_client_run_id": None}


@dataclass
class ParentAdjustment:
    requested_parent_id: object
    parent_id: object
    reason: str  # "max_depth" | "has_children"

    def as_dict(self):
        return {
            "requestedParentId": str(self.requested_parent_id) if self.requested_parent_id else None,
            "parentId": str(self.parent_id) if self.parent_id else None,
            "reason": self.reason,
        }


def _depth(issue: Issue | None) -> int:
    """1 for a top-level issue."""
    return 0 if issue is None else 1 + sum(1 for _ in walk_up(issue))


def _agent_parent(requested: Issue | None) -> tuple[Issue | None, ParentAdjustment | None]:
    """An agent nests at most parent + child: a grandchild goes beside the requester."""
    max_depth = settings.PAPERCLIP["MAX_AGENT_TASK_DEPTH"]
    if requested is None or _depth(requested) < max_depth:
        return requested, None
    placed = requested.parent
    return placed, ParentAdjustment(requested.pk, placed.pk if placed else None, "max_depth")


def _status_timestamps(issue: Issue, new_status: str, now):
    if new_status == IssueStatus.DONE:
        issue.completed_at = now
    elif new_status == IssueStatus.CANCELLED:
        issue.cancelled_at = now
    else:
        issue.completed_at = issue.cancelled_at = None
    if new_status != IssueStatus.IN_PROGRESS:
        _clear_lock(issue)


def _clear_lock(issue: Issue):
    """No checkout: host runs, lock time and a client's own run id."""
    for name, value in LOCK_FIELDS.items():
        setattr(issue, name, value)


def _next_issue_number(company_id) -> int:
    """One statement: the UPDATE takes the company row lock (serializing numbering) and returns
    the new counter (RETURNING: PostgreSQL, SQLite >= 3.35)."""
    table = Company._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f'UPDATE "{table}" SET "issue_counter" = "issue_counter" + 1 WHERE "id" = %s '
                       'RETURNING "issue_counter"', [Company._meta.pk.get_db_prep_value(company_id, connection)])
        return cursor.fetchone()[0]


def issue_create(
    *,
    actor: Actor,
    company: Company,
    title: str,
    description: str = "",
    status: str | None = IssueStatus.TODO,
    priority: str = IssuePriority.MEDIUM,
    parent_id=None,
    project_id=None,
    goal_id=None,
    assignee_agent_id=None,
    assignee_agent: Agent | None = None,
    block_parent_until_done: bool = False,
    origin_kind: str | None = None,
    origin_id: str = "",
    execution_workspace_id=None,
    workspace_strategy: str | None = None,
    inherit_workspace_from_id=None,
    label_ids=None,
    blocked_by_ids=None,
    assignment_wake: bool = True,
    assignee_user_id=None,
    billing_code: str = "",
    _savepoint: bool = True,
) -> tuple[Issue, ParentAdjustment | None]:
    """``assignment_wake=False`` records the assignee without the ``issue_assigned`` wake. Only the
    connector engine uses it: an issue a tracker routes for visibility (an ``external_observer`` or
    observer link) or creates after an external reopen must not start work by itself (§4.2.2).
    ``assignee_agent``: instead of ``assignee_agent_id``, the agent the caller read in this
    transaction (checked the same way, not read again). ``_savepoint=False``: inside a caller's
    transaction that any error rolls back whole (the connector engine's apply), no savepoint of its
    own (two round trips). ``status=None`` (the API without a status): upstream's default, todo
    with an assignee, else backlog."""
    actor.ensure_can_write(company.pk)
    if assignee_agent_id is not None or assignee_agent is not None or assignee_user_id is not None:
        ensure_may_assign(actor, "assigneeUserId" if assignee_user_id is not None else "assigneeAgentId")
    if status == IssueStatus.IN_PROGRESS:
        raise Unprocessable("Issues start work through checkout, not by creation in progress.",
                            code="use_checkout", details={"status": ["in_progress is reached by checkout."]})
    run = actor.named_live_run() if actor.is_agent else None  # creation is not run-scoped (ref §2.3)
    with transaction.atomic(savepoint=_savepoint):
        requested = company_object(Issue, company.pk, parent_id, "parentId")
        parent, adjustment = (_agent_parent(requested) if actor.is_agent else (requested, None))
        project = company_object(Project, company.pk, project_id, "projectId")
        goal = company_object(Goal, company.pk, goal_id, "goalId")
        assignee = assignable_agent(company.pk, assignee_agent_id, loaded=assignee_agent)
        assignee_user = assignable_user(company.pk, assignee_user_id)
        if assignee is not None and assignee_user is not None:
            raise _one_assignee()
        if status is None:
            status = IssueStatus.TODO if assignee is not None or assignee_user is not None else IssueStatus.BACKLOG
        inherit_from = company_object(Issue, company.pk, inherit_workspace_from_id,
                                      "inheritExecutionWorkspaceFromIssueId")
        labels = labels_resolve(company.pk, label_ids) if label_ids else []
        blockers = blockers_resolve(company.pk, None, blocked_by_ids) if blocked_by_ids else []
        if goal is None and parent is not None:
            goal = parent.goal
        # Every task gets its own workspace: parent/source give project and strategy only (seed 000).
        workspace = new_issue_workspace_fields(
            parent=parent, inherit_from=inherit_from, requested_workspace_id=execution_workspace_id,
            requested_strategy=workspace_strategy, project=project, requester=requested if adjustment else None,
            company=company,
        )

        number = _next_issue_number(company.pk)

        origin_issue = None
        if actor.is_agent:
            origin_issue = (run.issue if run is not None and run.issue_id else None) or requested
        issue = rows.insert(Issue(
            company=company,
            number=number,
            identifier=f"{company.issue_prefix}-{number}",
            title=title,
            description=description,
            status=status,
            priority=priority,
            priority_rank=PRIORITY_RANK[priority],
            parent=parent,
            goal=goal,
            **workspace,
            assignee_agent=assignee,
            assignee_user=assignee_user,
            billing_code=billing_code or "",
            created_by_agent=actor.agent,
            created_by_user=actor.user if actor.is_board else None,
            origin_issue=origin_issue,
            origin_kind=origin_kind or (OriginKind.AGENT if actor.is_agent else OriginKind.MANUAL),
            origin_id=origin_id,
            origin_run=run,
            completed_at=timezone.now() if status == IssueStatus.DONE else None,
            cancelled_at=timezone.now() if status == IssueStatus.CANCELLED else None,
        ))
        details = {"identifier": issue.identifier, "title": title, "status": status}
        if labels:
            issue.labels.set(labels)
            details["labelIds"] = sorted(str(label.pk) for label in labels)
        if blockers:
            details["blockedByIssueIds"] = _blockers_replace(issue, blockers)
        if adjustment:
            details["parentAdjusted"] = adjustment.as_dict()
        activity_record(actor=actor, company_id=company.pk, action="issue.created", entity_type="issue",
                        entity_id=issue.pk, details=details)
        if block_parent_until_done and requested is not None:
            _block_until_done(actor=actor, blocker=issue, blocked=requested)
        if status in TERMINAL_ISSUE_STATUSES and parent is not None:
            issue_became_terminal(issue)  # a child created finished may complete its parent's set
        if assignee is not None and assignment_wake:
            wake_assignee(issue=issue, source=WakeSource.ASSIGNMENT, reason=ISSUE_ASSIGNED, new_issue=True)
        events.announce(events.issue_created, issue=issue, actor=actor)
    return issue, adjustment


def _one_assignee():
    return Unprocessable("Issue can only have one assignee", code="one_assignee",
                         details={"assigneeUserId": ["Give an agent or a user, not both."]})


def _block_until_done(*, actor: Actor, blocker: Issue, blocked: Issue):
    """``blocked`` waits for ``blocker``. When the blocker reaches done or cancelled, issue_update's
    terminal trigger (.wake_triggers) returns ``blocked`` to todo and wakes its assignee."""
    blocked = Issue.objects.select_for_update().get(pk=blocked.pk)
    ensure_may_change(actor, blocked)  # blocking the requester changes it: an agent's own issue only
    IssueRelation.objects.get_or_create(company_id=blocked.company_id, issue=blocker, related_issue=blocked,
                                        kind=RelationKind.BLOCKS)
    if blocker.status in TERMINAL_ISSUE_STATUSES:
        return  # a blocker created finished has nothing left to wait for
    if blocked.status not in (IssueStatus.DONE, IssueStatus.CANCELLED, IssueStatus.BLOCKED):
        previous = blocked.status
        _status_timestamps(blocked, IssueStatus.BLOCKED, timezone.now())
        blocked.status = IssueStatus.BLOCKED
        blocked.save()
        activity_record(actor=actor, company_id=blocked.company_id, action="issue.updated", entity_type="issue",
                        entity_id=blocked.pk, details={"changes": {"status": [previous, IssueStatus.BLOCKED]},
                                                        "blockedBy": str(blocker.pk)})


def relation_add(*, actor: Actor, blocker: Issue, blocked: Issue) -> IssueRelation:
    actor.ensure_can_write(blocked.company_id)
    if actor.is_agent:
        actor.named_live_run()  # run-scoped only on its own in_progress issue (the fence below)
    if blocker.company_id != blocked.company_id:
        raise InvalidInput(details={"blockerId": ["Blockers must belong to the same company."]})
    if blocker.pk == blocked.pk:
        raise InvalidInput(details={"blockerId": ["An issue cannot block itself."]})
    with transaction.atomic():
        ensure_may_change(actor, Issue.objects.select_for_update().get(pk=blocked.pk))
        relation, created = IssueRelation.objects.get_or_create(
            company_id=blocked.company_id, issue=blocker, related_issue=blocked, kind=RelationKind.BLOCKS
        )
        if created:
            activity_record(actor=actor, company_id=blocked.company_id, action="issue.relation_added",
                            entity_type="issue", entity_id=blocked.pk,
                            details={"kind": "blocks", "blockerId": str(blocker.pk)})
    return relation


BLOCKERS_FIELD = "blockedByIssueIds"


def blockers_resolve(company_id, blocked_id, blocker_ids) -> list[Issue]:
    """The issues that are to block ``blocked_id`` (None: an issue not created yet).

    Upstream's rules, each a 422 naming blockedByIssueIds: issues of the same company (an unknown
    id reads the same, so nothing leaks), never the issue itself, and no cycle (the blocked issue
    must not already block a would-be blocker, directly or through others)."""
    wanted = list(dict.fromkeys(str(pk) for pk in blocker_ids))
    if blocked_id is not None and str(blocked_id) in wanted:
        raise Unprocessable("Issue cannot be blocked by itself", code="invalid_blockers",
                            details={BLOCKERS_FIELD: ["An issue cannot block itself."]})
    blockers = list(Issue.objects.filter(company_id=company_id, pk__in=wanted))
    if len(blockers) != len(wanted):
        raise Unprocessable("Blocked-by issues must belong to the same company.", code="invalid_blockers",
                            details={BLOCKERS_FIELD: ["Every blocker must be an issue of this company."]})
    if blocked_id is not None:
        # Walk up the blocker graph from the new blockers: one query per level, each level once.
        seen, frontier = set(), {b.pk for b in blockers}
        while frontier:
            if blocked_id in frontier:
                raise Unprocessable("Blocking relations cannot contain cycles", code="invalid_blockers",
                                    details={BLOCKERS_FIELD: ["The issue already blocks one of these."]})
            seen |= frontier
            frontier = set(IssueRelation.objects.filter(
                related_issue_id__in=frontier, kind=RelationKind.BLOCKS).values_list("issue_id", flat=True)) - seen
    return blockers


def _blockers_replace(issue: Issue, blockers: list[Issue]) -> list[str]:
    """Make ``blockers`` the issue's whole blocker set (the rows relation_add writes); their ids."""
    keep = [b.pk for b in blockers]
    IssueRelation.objects.filter(related_issue=issue, kind=RelationKind.BLOCKS).exclude(issue_id__in=keep).delete()
    IssueRelation.objects.bulk_create(
        [IssueRelation(company_id=issue.company_id, issue=b, related_issue=issue, kind=RelationKind.BLOCKS)
         for b in blockers], ignore_conflicts=True)
    return sorted(str(pk) for pk in keep)


def _is_descendant(candidate: Issue, ancestor_id) -> bool:
    return candidate.pk == ancestor_id or any(node.pk == ancestor_id for node in walk_up(candidate))


UPDATABLE = {"title", "description", "status", "priority", "assignee_agent_id", "assignee_user_id", "parent_id",
             "project_id", "goal_id", "label_ids", "blocked_by_ids", "billing_code"}
CLOSED_STATUSES = (IssueStatus.DONE, IssueStatus.CANCELLED)  # what ``reopen`` moves back to todo
INTERRUPT_BOARD_ONLY = "Only board users can interrupt active runs from issue comments"  # upstream's words
ISSUE_REOPENED_VIA_COMMENT = "issue_reopened_via_comment"  # upstream's wake reason


def _check_comment_flags(actor: Actor, comment, reopen: bool, interrupt: bool, attachment_ids=None):
    """Upstream's order: a flag without a comment is a 400, then interrupt by a non-board actor a 403."""
    flags = [name for name, given in (("interrupt", interrupt), ("reopen", reopen),
                                      ("attachmentIds", attachment_ids)) if given]
    if flags and not comment:
        message = ("Interrupt is only supported when posting a comment" if interrupt
                   else "Reopen is only supported when posting a comment" if reopen
                   else "Attachments are only supported when posting a comment")
        raise InvalidInput(message, details={name: ["Only together with a comment."] for name in flags})
    if interrupt and not actor.is_board:
        raise Forbidden(INTERRUPT_BOARD_ONLY, code="board_only")


_ISSUE_COLUMNS = tuple(f.attname for f in Issue._meta.concrete_fields if not f.primary_key)


def _row_values(issue: Issue) -> tuple:
    return tuple(getattr(issue, name) for name in _ISSUE_COLUMNS)


def _changed_fields(issue: Issue, before: tuple) -> list[str]:
    """The columns an update changed (and ``updated_at``): the UPDATE names only them."""
    changed = {name for name, old in zip(_ISSUE_COLUMNS, before) if getattr(issue, name) != old}
    return sorted(changed | {"updated_at"})


def issue_update(*, actor: Actor, issue: Issue, changes: dict, comment: str | None = None, reopen: bool = False,
                 interrupt: bool = False, assignment_wake: bool = True, attachment_ids=None, _locked: bool = False):
    """Apply a PATCH. Returns (issue, parent_adjustment, comment).

    ``assignment_wake=False``: a reassignment does not wake the new assignee (see issue_create).

    ``_locked``: the caller read ``issue`` with its row lock in its own transaction, which any error
    rolls back (the connector engine's apply): no second read of the row, no savepoints of its own.

    With a comment (upstream): ``reopen`` moves a done or cancelled issue back to todo (unless the
    PATCH sets a status) and the assignee wakes ``issue_reopened_via_comment``; ``interrupt`` (board
    only) first stops the issue's live runs, and the comment then starts the next run;
    ``attachment_ids`` (upstream's ``attachmentIds``) tie the issue's attachments to the comment."""
    from .runs import issue_run_stop
    from .thread import comment_create

    unknown = set(changes) - UPDATABLE
    if unknown:
        raise InvalidInput(details={name: ["Unknown field."] for name in unknown})
    _check_comment_flags(actor, comment, reopen, interrupt, attachment_ids)
    actor.ensure_can_write(issue.company_id)
    if _locked and (interrupt or not transaction.get_connection().in_atomic_block):
        raise ValueError("_locked: the caller's transaction holds the issue (an interrupt locks runs first)")
    with transaction.atomic(savepoint=not _locked):
        # Runs are locked before the issue row, in the order run_finish takes them.
        interrupted = issue_run_stop(actor=actor, issue=issue) if interrupt else []
        if not _locked:
            issue = Issue.objects.select_for_update(of=("self",)).select_related("parent").get(pk=issue.pk)
        before = _row_values(issue)
        reopened_from = None
        if reopen and "status" not in changes and issue.status in CLOSED_STATUSES:
            reopened_from = issue.status
            changes = {**changes, "status": IssueStatus.TODO}
        # The checkout run first (409), then ownership (403) for field changes; a comment-only
        # PATCH is a comment, which any agent of the company may post.
        if changes:
            ensure_may_change(actor, issue)
        else:
            ensure_owning_run(actor, issue)
        now = timezone.now()
        diff, adjustment = {}, None

        def set_field(name, value, shown=None):
            old = getattr(issue, name)
            if old != value:
                diff[name.removesuffix("_id")] = [_shown(old), _shown(shown if shown is not None else value)]
                setattr(issue, name, value)

        for name in ("title", "description"):
            if name in changes:
                set_field(name, changes[name])
        if "billing_code" in changes:
            set_field("billing_code", changes["billing_code"] or "")
        if "priority" in changes:
            set_field("priority", changes["priority"])
            issue.priority_rank = PRIORITY_RANK[issue.priority]
        if "project_id" in changes:
            project = company_object(Project, issue.company_id, changes["project_id"], "projectId")
            set_field("project_id", project.pk if project else None)
        if "goal_id" in changes:
            goal = company_object(Goal, issue.company_id, changes["goal_id"], "goalId")
            set_field("goal_id", goal.pk if goal else None)
        if "parent_id" in changes:
            adjustment = _apply_parent_change(actor, issue, changes["parent_id"], set_field)
        new_labels = None
        if "label_ids" in changes:
            new_labels = labels_resolve(issue.company_id, changes["label_ids"] or [])
            old_ids = sorted(str(pk) for pk in issue.labels.values_list("pk", flat=True))
            new_ids = sorted(str(label.pk) for label in new_labels)
            if old_ids != new_ids:
                diff["labelIds"] = [old_ids, new_ids]
            else:
                new_labels = None
        new_blockers = None
        if "blocked_by_ids" in changes:  # replaces the whole set; [] clears it
            new_blockers = blockers_resolve(issue.company_id, issue.pk, changes["blocked_by_ids"] or [])
            old_ids = sorted(str(pk) for pk in IssueRelation.objects.filter(
                related_issue=issue, kind=RelationKind.BLOCKS).values_list("issue_id", flat=True))
            new_ids = sorted(str(b.pk) for b in new_blockers)
            if old_ids != new_ids:
                diff[BLOCKERS_FIELD] = [old_ids, new_ids]
            else:
                new_blockers = None
        reassigned, assigned_before = False, (issue.assignee_agent_id, issue.assignee_user_id)
        if "assignee_agent_id" in changes:
            new_id = agent_ref_id(issue.company_id, changes["assignee_agent_id"])  # a UUID or shortname
            if str(new_id or "") != str(issue.assignee_agent_id or ""):  # keeping a terminated assignee is no change
                agent = assignable_agent(issue.company_id, new_id)
                new_id = agent.pk if agent else None
            else:
                new_id = issue.assignee_agent_id
            reassigned = new_id != issue.assignee_agent_id
            set_field("assignee_agent_id", new_id)
            if reassigned and new_id is not None:
                set_field("assignee_user_id", None)  # one assignee: the agent replaces a user
        if "assignee_user_id" in changes:
            user = assignable_user(issue.company_id, changes["assignee_user_id"])
            if user is not None and changes.get("assignee_agent_id") is not None:
                raise _one_assignee()
            if user is not None and user.pk != issue.assignee_user_id:
                reassigned = reassigned or issue.assignee_agent_id is not None
                set_field("assignee_agent_id", None)  # a person takes it back (upstream's skill: in_review)
                set_field("assignee_user_id", user.pk)
            elif user is None:
                set_field("assignee_user_id", None)
        if (issue.assignee_agent_id, issue.assignee_user_id) != assigned_before and \
                not _handed_back_to_creator(actor, issue, assigned_before[0]):
            ensure_may_assign(actor, "assigneeUserId" if "assignee_user_id" in changes else "assigneeAgentId")
        new_status = changes.get("status")
        if new_status is None and reassigned and issue.status == IssueStatus.IN_PROGRESS:
            new_status = IssueStatus.TODO  # a new owner starts with a fresh checkout
        if new_status is not None and new_status != issue.status:
            if new_status == IssueStatus.IN_PROGRESS and actor.is_agent:
                raise Unprocessable("Agents start work with checkout, never by PATCHing in_progress.",
                                    code="use_checkout", details={"status": ["Use POST /checkout."]})
            _status_timestamps(issue, new_status, now)
            set_field("status", new_status)
        elif reassigned:  # the new owner starts without the old one's lock, host run or client run id (ref §6)
            _clear_lock(issue)
        if issue.status == IssueStatus.IN_PROGRESS and issue.assignee_agent_id is None and issue.assignee_user_id is None:
            raise Unprocessable("in_progress issues require an assignee", code="assignee_required",
                                details={"assigneeAgentId": ["Required while the issue is in progress."]})
        if issue.status == IssueStatus.IN_PROGRESS and "status" in diff:
            # Entering in_progress, as checkout, needs every blocker done or cancelled (ref §6),
            # counting the blocker set this PATCH sets.
            blockers = (open_blockers(issue) if new_blockers is None
                        else [b for b in new_blockers if b.status not in TERMINAL_ISSUE_STATUSES])
            if blockers:
                raise BlockedByOpenIssues(blockers)
        if issue.status == IssueStatus.IN_PROGRESS and actor.is_board and issue.checkout_run_id is None and "status" in diff:
            issue.started_at = issue.started_at or now
        created_comment = None
        if diff:
            try:
                with transaction.atomic(savepoint=not _locked):
                    rows.update_fields(issue, _changed_fields(issue, before))
            except IntegrityError as exc:
                raise Unprocessable("The change violates an issue invariant.", code="invariant_violation",
                                    details={"non_field_errors": [str(exc).splitlines()[0]]})
            if new_labels is not None:
                issue.labels.set(new_labels)
            if new_blockers is not None:
                _blockers_replace(issue, new_blockers)
            details = {"changes": diff}
            if adjustment:
                details["parentAdjusted"] = adjustment.as_dict()
            if reopened_from:
                details.update(source="comment", reopened=True, reopenedFrom=reopened_from)
            activity_record(actor=actor, company_id=issue.company_id, action="issue.updated", entity_type="issue",
                            entity_id=issue.pk, details=details)
            events.issue_updated_atomic.send(sender=None, issue=issue, actor=actor, changes=diff)
            events.announce(events.issue_updated, issue=issue, actor=actor, changes=diff)
            if "status" in diff and issue.status in TERMINAL_ISSUE_STATUSES:
                issue_became_terminal(issue)  # every terminal status change passes here
            if reassigned and issue.assignee_agent_id is not None and assignment_wake:
                wake_assignee(issue=issue, source=WakeSource.ASSIGNMENT, reason=ISSUE_ASSIGNED)
        elif adjustment:
            activity_record(actor=actor, company_id=issue.company_id, action="issue.updated", entity_type="issue",
                            entity_id=issue.pk, details={"changes": {}, "parentAdjusted": adjustment.as_dict()})
        if comment:
            audit = {}
            if reopened_from:
                audit.update(reopened=True, reopenedFrom=reopened_from)
            if interrupted:
                audit["interruptedRunIds"] = [str(run.pk) for run in interrupted]
            created_comment = comment_create(
                actor=actor, issue=issue, body=comment, _locked=True, _audit=audit, attachment_ids=attachment_ids,
                _wake_reason=ISSUE_REOPENED_VIA_COMMENT if reopened_from else None, _after_interrupt=interrupt)
    return issue, adjustment, created_comment


def _apply_parent_change(actor, issue, parent_id, set_field):
    requested = company_object(Issue, issue.company_id, parent_id, "parentId")
    if requested is not None and _is_descendant(requested, issue.pk):
        raise Unprocessable("An issue cannot move under itself or its own descendant.", code="parent_cycle",
                            details={"parentId": ["Would create a cycle."]})
    if actor.is_agent:
        if requested is not None and issue.children.exists():
            # Moving a subtree would deepen it past two levels: only the parent change is skipped.
            if requested.pk != issue.parent_id:
                return ParentAdjustment(requested.pk, issue.parent_id, "has_children")
            return None
        placed, adjustment = _agent_parent(requested)
        set_field("parent_id", placed.pk if placed else None)
        return adjustment
    set_field("parent_id", requested.pk if requested else None)
    return None


def _handed_back_to_creator(actor: Actor, issue: Issue, agent_before) -> bool:
    """Upstream's one exception to ``tasks:assign`` on a reassignment: an agent hands its own issue
    back to the person who created it."""
    return (actor.is_agent and agent_before == actor.agent.pk and issue.assignee_agent_id is None
            and issue.assignee_user_id is not None and issue.assignee_user_id == issue.created_by_user_id)


def _shown(value):
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def issue_delete(*, actor: Actor, issue: Issue) -> Issue:
    """Delete an issue (board only), as upstream: its comments, documents, interactions, work
    products and blocker relations go with it. Its children are kept and move to the top level
    (``parentId`` null); other issues it blocked keep their status. Refused (409) while a live
    run holds or works it: stop the run first. Returns the deleted issue (its last state)."""
    from django.db.models import prefetch_related_objects

    from issues.choices import LIVE_RUN_STATUSES
    from issues.models import HeartbeatRun, Interaction

    actor.ensure_board()
    actor.ensure_can_write(issue.company_id)
    with transaction.atomic():
        issue = Issue.objects.select_for_update().get(pk=issue.pk)
        live = list(HeartbeatRun.objects.filter(
            Q(issue=issue) | Q(pk__in=[pk for pk in (issue.checkout_run_id, issue.execution_run_id) if pk]),
            status__in=LIVE_RUN_STATUSES).order_by("created_at").values_list("pk", flat=True))
        if live:
            raise Conflict("The issue has a live run; stop it before deleting the issue.", code="issue_run_active",
                           details={"issueId": str(issue.pk), "liveRunIds": [str(pk) for pk in live],
                                    "checkoutRunId": _shown(issue.checkout_run_id),
                                    "executionRunId": _shown(issue.execution_run_id)})
        prefetch_related_objects([issue], "labels")  # the response shows the labels it had
        # (No wake can still be waiting: a deferred wake waits for a live run on this issue.)
        children = Issue.objects.filter(parent=issue).count()
        activity_record(actor=actor, company_id=issue.company_id, action="issue.deleted", entity_type="issue",
                        entity_id=issue.pk, details={"identifier": issue.identifier, "title": issue.title,
                                                     "status": issue.status, "childrenDetached": children})
        pk = issue.pk
        # e.g. a connector's link to a tracker item holds it: unlink it first (nothing is deleted).
        with unless_held("The issue is still linked elsewhere; remove the link before deleting it.",
                         "issue_delete_restricted", detail="linkedBy", issueId=str(pk)):
            # Its interactions first: they protect the document revisions they point at.
            Interaction.objects.filter(issue=issue).delete()
            issue.delete()
        issue.pk = pk
    return issue
