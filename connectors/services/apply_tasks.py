"""Applying a tracker task's snapshot (§6.2 import after the §6.3 dedupe, §7 updates, §7.4
transitions, deletions) inside the apply's transaction (services/inbound.py)."""
from __future__ import annotations

import uuid

from django.utils import timezone

from connectors.choices import (
    ClosePolicy,
    ConflictKind,
    EventStatus,
    ErrorCategory,
    LinkStatus,
    OriginSide,
    OutboundKind,
    RunMode,
    StateCategory,
    SyncMode,
)
from connectors.models import TaskLink
from connectors.providers.base import (
    ExternalTask,
    ExternalTaskRef,
    ProviderError,
    VerifiedEvent,
    normalize_state_name,
    web_url,
)
from issues.actors import SYSTEM
from issues.choices import TERMINAL_ISSUE_STATUSES, IssueStatus, OriginKind
from issues.models import Issue
from issues.services.issues import issue_create, issue_update
from paperclip.core import rows

from . import audit, backlinks, close_reopen, content, export_marks, field_merge, links, routing
from . import routing_conflicts, run_modes, symphony
from .apply_base import UNLINKED_TEXT, Outcome, active_link, applied, dropped, link_audit, own_actor, touched
from .common import adapter_for, container_allowed, link_first_sync_ok, sync_error_record


def task_upserted(instance, verified: VerifiedEvent, key: str) -> Outcome:
    task = verified.task
    if task is None:  # a sparse (signed) payload names the task only: its container comes from the read-back
        try:
            task = adapter_for(instance).get_task(ExternalTaskRef(external_id=verified.external_task_id))
        except ProviderError as exc:
            if exc.status != 404:
                raise  # retried like every failed apply
            return dropped("read-back: the task no longer exists (its deletion arrives as its own event)")
        if not container_allowed(instance, task.container_id):
            return dropped(f"read-back: task in another container ({task.container_id})")
    link = active_link(instance, task.external_id)
    if link is None:
        return task_import_unless_unlinked(instance=instance, task=task, key=key, actor=verified.actor)
    if verified.actor is not None and own_actor(instance, verified.actor):
        return dropped("the connector's own change (echo)")
    return link_apply_task(instance=instance, link=link, task=task, key=key, actor=verified.actor)


def task_import_unless_unlinked(*, instance, task: ExternalTask, key: str, actor=None) -> Outcome:
    """An event about a task with no live link imports it (§6.2), unless an operator unlinked it
    from this connector (§6.4): it stays out until it is imported or linked by hand."""
    pairings = backlinks.task_pairings(instance, task.external_id)
    if pairings.unlinked_here:
        return dropped(UNLINKED_TEXT)
    return task_import(instance=instance, task=task, key=key, actor=actor, pairings=pairings)


def task_import(*, instance, task: ExternalTask, key: str, actor=None, manual: bool = False,
                pairings: backlinks.TaskPairings | None = None) -> Outcome:
    """§6.2 import / §15.1, after the §6.3 dedupe (``pairings``: the task's past links, if the
    caller read them to see whether an operator unlinked it)."""
    if not manual and not instance.auto_import:
        return dropped("auto-import is off for this connector")
    if not manual and task.state.category == StateCategory.TERMINAL:
        return dropped("terminal external task is not imported")
    export = None if manual else export_marks.unlinked_export_of(instance, task)
    if export is not None:  # its creation webhook beat the export's answer (or the answer was lost)
        return dropped(f"created by the export of {export.issue.identifier} (export {export.pk}), which links it")
    label = links.provider_label(instance)
    existing, how = links.dedupe_issue(instance, task, pairings)
    if existing is not None:  # §6.3: paired as a manual link (§6.2.3), divergence as conflicts
        link, diverged = links.link_existing(instance=instance, issue=existing, task=task, key=key, how=how)
        link_audit(link, "connector.task_linked", key, {"dedupe": how, "actor": content.actor_dict(actor),
                                                    "issueId": str(existing.pk), "divergedFields": diverged})
        return applied(f"linked existing issue {existing.identifier} ({how})"
                       + (f"; conflicts: {', '.join(diverged)}" if diverged else ""))
    link_id = uuid.uuid4()
    audit.link_reserved(link_id)  # the issue is created on behalf of this link: its rows say so
    decision = routing.routing_resolve(instance=instance, task=task)
    status = links.initial_status(task.state.category)
    issue, _ = issue_create(
        actor=SYSTEM, company=instance.company, title=content.render_title(task),
        description=content.render_description(task, label), status=status,
        priority=links.issue_priority(task) or "medium", project_id=instance.project_id, goal_id=instance.goal_id,
        assignee_agent=decision.agent, origin_kind=OriginKind.CONNECTOR,  # routing read it in this transaction
        origin_id=content.attribution_key(instance.pk, task.external_id),
        assignment_wake=run_modes.import_may_wake(instance),  # assigned for visibility, never started (§4.2.2)
        _savepoint=False,  # (any error rolls the apply back whole)
    )
    link = links.link_create(instance=instance, issue=issue, task=task, key=key, origin_side=OriginSide.EXTERNAL,
                             routing=decision.as_dict(), cause="imported", status=LinkStatus.HEALTHY,
                             link_id=link_id)
    _routing_problems(instance, link, decision, issue, key)
    _state_mapping_check(instance, link, task, previous_name=None)
    links.backlink_record(link=link, instance=instance, issue=issue)
    link_audit(link, "connector.task_imported", key, {"issueId": str(issue.pk), "identifier": issue.identifier,
                                                  "routing": decision.as_dict(), "actor": content.actor_dict(actor)})
    link_first_sync_ok(link, key)
    if run_modes.connector_may_wake(link) and task.state.category == StateCategory.ACTIVE:
        # Imported already active (§15.3): a tracker-driven cycle like any task that becomes active; its
        # wake coalesces into the assignment run issue_create queued, which then carries the packet.
        symphony.connector_wake(link=link, issue=issue, key=key, task=task)
    return Outcome(EventStatus.APPLIED, f"imported as {issue.identifier}", numbered=True)


def _routing_problems(instance, link, decision: routing.RoutingDecision, issue: Issue, key: str):
    for problem in decision.problems:
        sync_error_record(instance=instance, category=ErrorCategory.ROUTING, message=problem, link=link)
    if decision.fell_back:
        who = decision.agent.name if decision.agent else "nobody (no usable triage agent)"
        body = (f"Unresolved routing for {link.external_key or link.external_task_id}: {decision.reason}. "
                f"Assigned to the triage fallback: {who}.")
        if run_modes.is_observer(link):  # mutates neither side: the fallback is a health entry only
            sync_error_record(instance=instance, category=ErrorCategory.ROUTING, message=body, link=link)
            return
        links.note(issue, body, link=link, key=key, kind="routing_unresolved")
        from .outbound import effect_record, write_refusal

        if not write_refusal(link, OutboundKind.COMMENT):
            effect_record(link=link, kind=OutboundKind.COMMENT, source_id=f"routing-unresolved:{issue.pk}",
                          payload={"body": body})


def _state_mapping_check(instance, link, task: ExternalTask, previous_name: str | None):
    """§7.2: an unmapped state is inert backlog and reported in health (once per state change)."""
    if previous_name is not None and normalize_state_name(previous_name) == normalize_state_name(task.state.name):
        return
    if not _state_mapped(instance, task):
        sync_error_record(instance=instance, category=ErrorCategory.STATE_UNMAPPED, link=link,
                          message=f"State '{task.state.name}' of {task.external_key or task.external_id} is not in "
                                  f"the state mapping; treated as backlog.")


def _state_mapped(instance, task: ExternalTask) -> bool:
    envelope = task.envelope or {}
    if envelope.get("unmappedState"):
        return False  # the adapter says it found no mapping for this state
    if isinstance(envelope.get("stateMapped"), bool):
        return envelope["stateMapped"]
    name = normalize_state_name(task.state.name)
    mapping = instance.state_mapping or {}
    if not mapping:
        return True  # the provider's built-in mapping applies

    def contains(value) -> bool:
        if isinstance(value, str):
            return normalize_state_name(value) == name
        if isinstance(value, dict):
            return any(normalize_state_name(k) == name or contains(v) for k, v in value.items())
        if isinstance(value, (list, tuple)):
            return any(contains(v) for v in value)
        return False

    return contains(mapping)


def link_apply_task(*, instance, link: TaskLink, task: ExternalTask, key: str, actor=None) -> Outcome:
    """Apply a fresh external snapshot to a linked issue (fields, state category, routing)."""
    if link.status == LinkStatus.PAUSED:
        return dropped("link paused (resume resyncs it)")
    if link.sync_mode in (SyncMode.DISABLED, SyncMode.EXPORT_ONLY):
        return dropped(f"link sync mode {link.sync_mode}")
    if link.external_updated_at and task.updated_at and task.updated_at < link.external_updated_at:
        return dropped("older than the state already applied")
    label = links.provider_label(instance)
    base = link.base_snapshot or {}
    base_ext, base_pc = base.get("external") or {}, base.get("paperclip") or {}
    ext = links.external_snapshot(task, label)
    ext["dueAt"] = task.due_at.isoformat() if task.due_at else None
    issue = link.issue
    observer = link.sync_mode == SyncMode.OBSERVER
    changes, notes = {}, []
    actor_text = content.actor_label(actor)

    held = set()  # fields in conflict: their base stays where it was until the conflict is resolved
    if not observer:
        held = field_merge.fields_three_way(link, issue, task, ext, base_ext, base_pc, changes, key, actor_text)
    pending = field_merge.paperclip_pending(issue, task, ext, base_pc, changes)
    issue_before = issue.pk

    previous_category = link.external_state_category or base_ext.get("category")
    category_changed = previous_category != task.state.category
    if category_changed and not observer:
        notes += _category_transition(instance, link, issue, previous_category, task, key, actor_text, changes)
        issue = link.issue  # a reopen may have retargeted the link

    route_inputs = ("labels", "assignees", "state", "customFields")
    if not observer and any(ext[k] != base_ext.get(k) for k in route_inputs) and issue.status not in \
            TERMINAL_ISSUE_STATUSES:
        _reroute(instance, link, issue, task, key, changes, notes)

    previous_name = link.external_state_name
    if changes:
        if category_changed and "status" in changes:
            # The status change is projected to every link of the issue (outbound.status_changed), which
            # reads each link's tracker state: this one's is the tracker's own already, so the change
            # that came from it is not echoed back to it as a transition or a "marked done" comment.
            link.external_state_name, link.external_state_category = task.state.name[:200], task.state.category
            rows.update_fields(link, ["external_state_name", "external_state_category"])
        issue, _, _ = issue_update(actor=SYSTEM, issue=issue, changes=changes,
                                   assignment_wake=run_modes.connector_may_wake(link),
                                   _locked=issue.pk == issue_before)  # (read and locked with the link)
        link.issue = issue
    for body in notes:
        links.note(issue, body, link=link, key=key, kind="state")
    _state_mapping_check(instance, link, task, previous_name=previous_name)

    link.external_title = task.title[:500]
    link.external_key = task.external_key or link.external_key
    # (a script URL stored before adapters filtered URLs is dropped on the next sync, not kept)
    link.external_url = task.url or web_url(link.external_url)
    link.external_state_name = task.state.name[:200]
    link.external_state_category = task.state.category
    link.external_updated_at = task.updated_at or link.external_updated_at
    link.last_external_revision = task.revision
    link.envelope = dict(task.envelope or {})
    link.last_inbound_at = timezone.now()
    if issue.pk != issue_before:
        pending = set()  # retargeted to a follow-up: its base starts from its own values
    link.base_snapshot = field_merge.base_advance(ext, links.paperclip_snapshot(issue), base_ext, base_pc, held,
                                                  pending)
    rows.update_fields(link, ["external_title", "external_key", "external_url", "external_state_name",
                              "external_state_category", "external_updated_at", "last_external_revision",
                              "envelope", "last_inbound_at", "base_snapshot", "issue", "routing", "handoff_history",
                              "updated_at"])
    touched(link)
    if not observer and symphony.is_symphony(link):
        became_todo = changes.get("status") == IssueStatus.TODO
        if task.state.category == StateCategory.ACTIVE and (category_changed or became_todo):
            symphony.connector_wake(link=link, issue=issue, key=key, task=task)
        elif category_changed and previous_category == StateCategory.ACTIVE:
            symphony.left_active(link=link, issue=issue, new_category=task.state.category, actor_text=actor_text,
                                 key=key)
    link_first_sync_ok(link, key)
    what = ", ".join(sorted(changes)) or "no field change"
    return applied(f"{issue.identifier}: {what}" + (" (observer)" if observer else ""))


def _category_transition(instance, link, issue, previous, task, key, actor_text, changes) -> list[str]:
    """§7.4: external transitions become host-level requests or conflicts, never silent status sets."""
    new = task.state.category
    ref = link.external_key or link.external_task_id
    notes = []
    if new == StateCategory.TERMINAL:
        if issue.status in TERMINAL_ISSUE_STATUSES:
            return notes
        # §7.4 close policy (services/close_reopen.py): auto-close only an idle issue, else a conflict
        auto = close_reopen.close_policy_of(link, instance) == ClosePolicy.AUTO_CLOSE
        waits = close_reopen.auto_close_waits(issue) if auto else []
        if auto and not waits:
            changes["status"] = IssueStatus.DONE
            notes.append(f"{actor_text} closed {ref} ({task.state.name}); the idle issue was closed with it "
                         f"(close policy auto_close).")
            link_audit(link, "connector.issue_auto_closed", key, {"issueId": str(issue.pk), "fromStatus": issue.status,
                                                              "externalState": task.state.name, "actor": actor_text})
        else:
            why = f"; auto-close waits: {', '.join(waits)}" if waits else ""
            created = links.conflict_open(link=link, kind=ConflictKind.CLOSURE, key=key,
                                          detail=f"external task closed ({task.state.name}) while the issue is "
                                                 f"{issue.status}{why}", external={"state": task.state.name},
                                          paperclip={"status": issue.status}, actors={"external": actor_text})[1]
            if created:
                notes.append(f"{actor_text} moved {ref} to '{task.state.name}' (terminal) while this issue is "
                             f"{issue.status}. Nothing was closed here: finish, cancel or resolve the conflict."
                             + (f" Auto-close waits: {', '.join(waits)}." if waits else ""))
        return notes
    if previous == StateCategory.TERMINAL and issue.status in TERMINAL_ISSUE_STATUSES:
        if close_reopen.reopens_in_place(instance):  # §7.4 reopen policy "reopen": the same issue
            changes["status"] = links.initial_status(new)
            link_audit(link, "connector.issue_reopened", key, {"issueId": str(issue.pk), "fromStatus": issue.status,
                                                           "toStatus": changes["status"],
                                                           "externalState": task.state.name, "actor": actor_text})
            notes.append(f"{actor_text} reopened {ref} ({task.state.name}); this issue was reopened "
                         f"({issue.status} -> {changes['status']}, reopen policy).")
            return notes
        follow_up = _follow_up(instance, link, issue, task, key)
        notes.append(f"{actor_text} reopened {ref}; follow-up issue {follow_up.identifier} now carries the link.")
        return notes
    if new == StateCategory.ACTIVE and issue.status == IssueStatus.BACKLOG:
        if link.run_mode == RunMode.SYMPHONY_COMPATIBLE:
            changes["status"] = IssueStatus.TODO
        else:
            notes.append(f"{actor_text} moved {ref} to '{task.state.name}' (active). This issue stays in backlog "
                         f"until someone here schedules it.")
    elif previous == StateCategory.ACTIVE and new in (StateCategory.BACKLOG, StateCategory.BLOCKED):
        notes.append(f"{actor_text} moved {ref} to '{task.state.name}' ({new}).")
    return notes


def _follow_up(instance, link: TaskLink, issue: Issue, task: ExternalTask, key: str) -> Issue:
    """Reopen of a terminal issue: an idempotent follow-up issue, then one retarget of the link."""
    origin = f"{content.attribution_key(instance.pk, task.external_id)}:reopen:{len(link.handoff_history) + 1}"[:200]
    follow_up = Issue.objects.filter(company_id=link.company_id, origin_kind=OriginKind.CONNECTOR,
                                     origin_id=origin).first()
    if follow_up is None:
        follow_up, _ = issue_create(
            actor=SYSTEM, company=instance.company, title=content.render_title(task),
            description=content.render_description(task, links.provider_label(instance)),
            status=links.initial_status(task.state.category), priority=issue.priority, project_id=issue.project_id,
            goal_id=issue.goal_id, assignee_agent_id=issue.assignee_agent_id, origin_kind=OriginKind.CONNECTOR,
            origin_id=origin, parent_id=None,
            # an external reopen informs; only the Symphony profile lets it start work (§4.2.2)
            assignment_wake=symphony.is_symphony(link) and run_modes.connector_may_wake(link))
    link.handoff_history = [*link.handoff_history, {"issueId": str(issue.pk), "endedAt": timezone.now().isoformat(),
                                                    "cause": "external reopen"}]
    link.issue = follow_up
    link.save(update_fields=["issue", "handoff_history", "updated_at"])
    link_audit(link, "connector.link_retargeted", key, {"fromIssueId": str(issue.pk), "toIssueId": str(follow_up.pk)})
    return follow_up


def _reroute(instance, link, issue, task, key, changes, notes):
    decision = routing.routing_resolve(instance=instance, task=task,
                                       command_agent=(link.routing or {}).get("commandAgent"))
    for problem in decision.problems:
        sync_error_record(instance=instance, category=ErrorCategory.ROUTING, message=problem, link=link)
    previous = link.routing or {}
    link.routing = decision.as_dict() | {"commandAgent": previous.get("commandAgent")}
    # §11.1: a route that does not resolve on a linked task is a routing conflict; its owner stays
    if routing_conflicts.route_held(link=link, issue=issue, decision=decision, previous=previous, task=task, key=key):
        return
    if decision.agent is None or decision.agent.pk == issue.assignee_agent_id:
        return
    if issue.status == IssueStatus.IN_PROGRESS:
        notes.append(f"Routing now points at {decision.agent.name} ({decision.reason}). The issue is checked out, "
                     f"so it was not reassigned: handoff requested from the current owner.")
        return
    changes["assignee_agent_id"] = decision.agent.pk


def task_deleted(instance, verified: VerifiedEvent, key: str) -> Outcome:
    link = active_link(instance, verified.external_task_id or "")
    if link is None:
        return dropped("deleted task was not linked")
    transfer = "transfer" in (verified.action or "")
    what = "moved out of the connector's container" if transfer else "deleted"
    if transfer:
        task = _still_here(instance, link)
        if task is not None:  # left one container for another of ours (Asana multi-project): an update
            return link_apply_task(instance=instance, link=link, task=task, key=key, actor=verified.actor)
    if run_modes.is_observer(link):
        return applied(run_modes.observer_deletion(link, what=what, actor_text=content.actor_label(verified.actor),
                                                   key=key))
    created = links.deletion_handle(link=link, issue=link.issue, actor_text=content.actor_label(verified.actor),
                                    key=key, what=what)
    return applied("deletion conflict opened" if created else "deletion conflict already open")


def _still_here(instance, link: TaskLink) -> ExternalTask | None:
    """A task said to have moved out, as the provider has it now, when it is still in one of the instance's
    containers; None when it is gone or elsewhere, or the provider cannot say (a deletion conflict is the
    safe answer: it never deletes anything)."""
    try:
        task = adapter_for(instance).get_task(ExternalTaskRef(external_id=link.external_task_id,
                                                              external_key=link.external_key or None))
    except ProviderError:
        return None
    return task if task.container_id and container_allowed(instance, task.container_id) else None
