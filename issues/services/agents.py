"""Agent lifecycle writes used by the operator console and the API: create rules, update,
permissions, pause / resume / terminate (which stop the agent's live runs), delete, adapter configuration,
and the on-demand heartbeat (``agent_wakeup`` like every wake)."""
from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from issues import events
from issues.actors import Actor
from issues.adapters import AdapterConfigError, get_adapter
from issues.adapters.base import secret_refs_check
from issues.choices import LIVE_RUN_STATUSES, AdapterType, AgentRole, AgentStatus, WakeSource
from issues.exceptions import Conflict, Forbidden, InvalidInput, NotFound, Unauthorized, Unprocessable
from issues.models import Agent, AgentApiKey, HeartbeatRun, WakeupRequest
from issues.selectors import walk_up

from .activity import activity_record
from .deletion import unless_held
from .agent_grants import PERMISSION_KEYS, agent_permissions
from .company_stop import RESERVED_PAUSE_REASONS, ensure_company_running
from .host_commands import adapter_command_check
from .run_policy import KNOBS
from .runs import run_cancel
from .start_rules import stopped_by_company
from .wakeups import agent_wakeup, ensure_may_invoke

MANUAL_PAUSE = "paused by the board"


def _ensure_not_pending(agent: Agent, what: str) -> None:
    """A hire waiting for approval leaves that state only through its ``hire_agent`` approval
    (approved: idle; rejected: terminated), never by a pause, a resume or a status PATCH."""
    if agent.status == AgentStatus.PENDING_APPROVAL:
        raise Conflict(f"Pending approval agents cannot be {what}", code="agent_pending_approval",
                       details={"status": ["Approve or reject the agent's hire_agent approval."]})


def _locked(agent: Agent) -> Agent:
    return Agent.objects.select_for_update().get(pk=agent.pk)


def ensure_agent(actor: Actor) -> None:
    """The agent's own routes (``/agents/me…``): a board credential is not an agent (upstream's 401)."""
    if not actor.is_agent:
        raise Unauthorized("Agent authentication required", code="agent_auth_required")


def _lock_live_runs(agent: Agent) -> list[HeartbeatRun]:
    """The agent's live runs, row-locked BEFORE the agent's row: everything that ends a run (a
    runner's terminal, usage, run_finish) locks the run and then the agent, so taking the agent
    first here would deadlock against it on PostgreSQL."""
    return list(HeartbeatRun.objects.select_for_update().filter(agent_id=agent.pk, status__in=LIVE_RUN_STATUSES)
                .order_by("created_at", "pk"))


def _stop_live_runs(actor: Actor, runs: list[HeartbeatRun], reason: str) -> None:
    """Cancel every queued, scheduled or running run of the agent (processes are killed by their adapter)."""
    for run in runs:
        run_cancel(actor=actor, run=run, reason=reason)


def agent_pause(*, actor: Actor, agent: Agent, reason: str = "", stop_runs: bool = False) -> Agent:
    """Stop new runs of the agent (wakes are skipped, queued runs are cancelled when claimed).
    ``stop_runs`` (the API, as upstream) also cancels its live runs now, even when already paused."""
    actor.ensure_board()
    actor.ensure_can_write(agent.company_id)
    if reason in RESERVED_PAUSE_REASONS:
        raise InvalidInput(details={"reason": [f"'{reason}' is a reason the host sets; describe the board's own."]})
    with transaction.atomic():
        live = _lock_live_runs(agent) if stop_runs else []
        agent = _locked(agent)
        if agent.status == AgentStatus.TERMINATED:
            raise Conflict("A terminated agent cannot be paused.", code="agent_terminated")
        _ensure_not_pending(agent, "paused")
        if stopped_by_company(agent):  # the board's own pause: it outlasts the company's stop
            agent.pause_reason = (reason or MANUAL_PAUSE)[:200]
            agent.save(update_fields=["pause_reason", "updated_at"])
            activity_record(actor=actor, company_id=agent.company_id, action="agent.paused", entity_type="agent",
                            entity_id=agent.pk, details={"from": agent.status, "reason": agent.pause_reason})
        elif agent.status != AgentStatus.PAUSED:
            previous = agent.status
            agent.status = AgentStatus.PAUSED
            agent.pause_reason = (reason or MANUAL_PAUSE)[:200]
            agent.save(update_fields=["status", "pause_reason", "updated_at"])
            activity_record(actor=actor, company_id=agent.company_id, action="agent.paused", entity_type="agent",
                            entity_id=agent.pk, details={"from": previous, "reason": agent.pause_reason})
        if stop_runs:
            _stop_live_runs(actor, live, "agent_paused")
    return agent


def agent_resume(*, actor: Actor, agent: Agent, strict: bool = True) -> Agent:
    """Back to idle. ``strict`` (the console): only a paused agent. Otherwise (the API, as upstream)
    an agent in error is resumed too, an active one is returned unchanged; a terminated one is a 409."""
    actor.ensure_board()
    actor.ensure_can_write(agent.company_id)
    with transaction.atomic():
        agent = _locked(agent)
        if not strict and agent.status == AgentStatus.TERMINATED:
            raise Conflict("Cannot resume terminated agent", code="agent_terminated")
        _ensure_not_pending(agent, "resumed")
        if not strict and agent.status not in (AgentStatus.PAUSED, AgentStatus.ERROR):
            return agent
        if strict and agent.status != AgentStatus.PAUSED:
            raise Conflict("The agent is not paused.", code="agent_not_paused", details={"status": agent.status})
        ensure_company_running(agent.company_id)
        agent.status = AgentStatus.IDLE
        agent.pause_reason = ""
        agent.save(update_fields=["status", "pause_reason", "updated_at"])
        activity_record(actor=actor, company_id=agent.company_id, action="agent.resumed", entity_type="agent",
                        entity_id=agent.pk, details={})
    return agent


def adapter_config_validate(adapter_type: str, adapter_config, *, company_id) -> None:
    """The adapter's own rules for its configuration, at write time: secret references that the
    server's allow-list gives to the agent's company, an http wake URL that the outbound guard
    accepts, a usable command."""
    if adapter_type not in AdapterType.values:
        raise InvalidInput(details={"adapterType": [f"'{adapter_type}' is not one of {', '.join(AdapterType.values)}."]})
    if not isinstance(adapter_config, dict):
        raise InvalidInput(details={"adapterConfig": ["Must be a JSON object."]})
    try:
        get_adapter(adapter_type).validate_config(adapter_config)
        secret_refs_check(adapter_config, company_id=company_id)
    except AdapterConfigError as exc:
        raise InvalidInput(details={"adapterConfig": [str(exc)]}) from None


def agent_adapter_update(*, actor: Actor, agent: Agent, adapter_type: str, adapter_config: dict) -> Agent:
    """Replace the adapter type and its configuration (a JSON object)."""
    actor.ensure_can_write(agent.company_id)
    adapter_config_validate(adapter_type, adapter_config, company_id=agent.company_id)
    with transaction.atomic():
        agent = _locked(agent)
        adapter_command_check(actor, adapter_type, adapter_config, current_type=agent.adapter_type,
                              current_config=agent.adapter_config)
        changes = sorted(name for name, value in (("adapter_type", adapter_type), ("adapter_config", adapter_config))
                         if getattr(agent, name) != value)
        if not changes:
            return agent
        agent.adapter_type, agent.adapter_config = adapter_type, adapter_config
        agent.save(update_fields=["adapter_type", "adapter_config", "updated_at"])
        activity_record(actor=actor, company_id=agent.company_id, action="agent.adapter_updated",
                        entity_type="agent", entity_id=agent.pk,
                        details={"changes": changes, "adapterType": adapter_type})
    return agent


# --- the upstream-compatible API (paperclip-api.md §5.1) ------------------------------------------
# runtime_config keys the host reads (run_policy, dispatch): each a non-negative integer.
RUNTIME_INT_KEYS = tuple(key for key, _default in KNOBS.values()) + ("maxConcurrentRuns",)
PATCH_STATUSES = (AgentStatus.ACTIVE, AgentStatus.IDLE, AgentStatus.PAUSED, AgentStatus.ERROR)


def ensure_can_create_agents(actor: Actor, company_id, *, sets_permissions: bool) -> None:
    """Board users with a write role create agents; an agent only with ``canCreateAgents`` (no run
    header needed, ref §2.3), and never granting permissions."""
    actor.ensure_can_write(company_id)
    if not actor.is_agent:
        return
    if not agent_permissions(actor.agent)["canCreateAgents"]:
        raise Forbidden("Missing permission: agents:create", code="missing_permission")
    if sets_permissions:
        raise Forbidden("Only board users grant agent permissions.", code="board_only")
    actor.named_live_run()


def runtime_config_validate(runtime_config) -> None:
    if not isinstance(runtime_config, dict):
        raise InvalidInput(details={"runtimeConfig": ["Must be a JSON object."]})
    bad = [key for key in RUNTIME_INT_KEYS if key in runtime_config and not (
        isinstance(runtime_config[key], int) and not isinstance(runtime_config[key], bool) and 0 <= runtime_config[key]
        <= 2**31 - 1)]
    if bad:
        raise InvalidInput(details={"runtimeConfig": [f"{key} must be a non-negative integer." for key in bad]})


def _reporting_line_check(agent: Agent, manager: Agent | None) -> None:
    if manager is None:
        return
    if manager.company_id != agent.company_id:  # callers resolve it in the company; never trust that
        raise Unprocessable("The manager must belong to the same company.", code="manager_other_company",
                            details={"reportsTo": ["No such agent in this company."]})
    if manager.pk == agent.pk or any(up.pk == agent.pk for up in walk_up(manager, "reports_to")):
        raise Unprocessable("An agent cannot report to itself or to one of its reports.", code="reporting_cycle",
                            details={"reportsTo": ["This would make a reporting cycle."]})


# API field -> model field, for PATCH /agents/{id} (status is handled on its own).
AGENT_FIELDS = {"name": "name", "role": "role", "title": "title", "reportsTo": "reports_to",
                "capabilities": "capabilities", "adapterType": "adapter_type", "adapterConfig": "adapter_config",
                "runtimeConfig": "runtime_config", "budgetMonthlyCents": "budget_monthly_cents", "icon": "icon",
                "metadata": "metadata"}


def agent_update(*, actor: Actor, agent: Agent, changes: dict) -> Agent:
    """Board only: a partial update with upstream field names (``AGENT_FIELDS`` and ``status``).
    Setting ``paused`` pauses as ``/pause`` does (live runs stopped); ``terminated`` only through
    ``/terminate``; ``running`` is the host's. One ``agent.updated`` row (and ``agent.budget_updated``)."""
    actor.ensure_board()
    actor.ensure_can_write(agent.company_id)
    status = changes.get("status")
    if status is not None and status not in PATCH_STATUSES:
        hint = "use POST /api/agents/{id}/terminate" if status == AgentStatus.TERMINATED else "the host sets it"
        raise Unprocessable(f"Status '{status}' cannot be set here: {hint}.", code="status_not_settable",
                            details={"status": [f"Must be one of {', '.join(PATCH_STATUSES)}."]})
    if "role" in changes and changes["role"] not in AgentRole.values:
        raise InvalidInput(details={"role": [f"'{changes['role']}' is not one of {', '.join(AgentRole.values)}."]})
    if "runtimeConfig" in changes:
        runtime_config_validate(changes["runtimeConfig"])
    # upstream's null clears them; the columns keep "" and {}
    if "icon" in changes and changes["icon"] is None:
        changes = {**changes, "icon": ""}
    if "metadata" in changes and changes["metadata"] is None:
        changes = {**changes, "metadata": {}}
    if "adapterType" in changes or "adapterConfig" in changes:  # before the lock: it may resolve a URL
        adapter_config_validate(changes.get("adapterType", agent.adapter_type),
                                changes.get("adapterConfig", agent.adapter_config), company_id=agent.company_id)
    try:
        with transaction.atomic():
            agent = _locked(agent)
            if "adapterType" in changes or "adapterConfig" in changes:
                adapter_command_check(actor, changes.get("adapterType", agent.adapter_type),
                                      changes.get("adapterConfig", agent.adapter_config),
                                      current_type=agent.adapter_type, current_config=agent.adapter_config)
            if "reportsTo" in changes:
                _reporting_line_check(agent, changes["reportsTo"])
            changed = []
            budget_before = agent.budget_monthly_cents
            for api_name, field in AGENT_FIELDS.items():
                if api_name in changes and getattr(agent, field) != changes[api_name]:
                    setattr(agent, field, changes[api_name])
                    changed.append(api_name)
            if status is not None and status != agent.status:
                if agent.status == AgentStatus.TERMINATED:
                    raise Conflict("A terminated agent stays terminated.", code="agent_terminated")
                _ensure_not_pending(agent, "given another status")
                changed.append("status")
            if changed:
                agent.save()
            if status == AgentStatus.PAUSED:
                agent = agent_pause(actor=actor, agent=agent, stop_runs=True)
            elif status is not None and status != agent.status:
                ensure_company_running(agent.company_id)
                agent.status, agent.pause_reason = status, ""
                agent.save(update_fields=["status", "pause_reason", "updated_at"])
            if changed:
                activity_record(actor=actor, company_id=agent.company_id, action="agent.updated",
                                entity_type="agent", entity_id=agent.pk, details={"changes": changed})
            if "budgetMonthlyCents" in changed:
                activity_record(actor=actor, company_id=agent.company_id, action="agent.budget_updated",
                                entity_type="agent", entity_id=agent.pk,
                                details={"from": budget_before, "to": agent.budget_monthly_cents})
    except IntegrityError:
        raise Conflict("An agent with that name exists in this company.", code="agent_name_taken",
                       details={"name": [changes.get("name", "")]})
    return agent


def agent_permissions_update(*, actor: Actor, agent: Agent, values: dict) -> Agent:
    """Board only: set ``canCreateAgents`` / ``canAssignTasks`` (the flags not given stay)."""
    actor.ensure_board()
    actor.ensure_can_write(agent.company_id)
    with transaction.atomic():
        agent = _locked(agent)
        before = agent_permissions(agent)
        after = {**before, **{key: bool(values[key]) for key in PERMISSION_KEYS if key in values}}
        if after != before:
            agent.permissions = after
            agent.save(update_fields=["permissions", "updated_at"])
            activity_record(actor=actor, company_id=agent.company_id, action="agent.permissions_updated",
                            entity_type="agent", entity_id=agent.pk, details={"from": before, "to": after})
    return agent


def agent_terminate(*, actor: Actor, agent: Agent) -> Agent:
    """Board only, final: the agent never runs again, every key is revoked (its requests are 401),
    its live runs are cancelled. Terminating a terminated agent changes nothing."""
    actor.ensure_board()
    actor.ensure_can_write(agent.company_id)
    with transaction.atomic():
        live = _lock_live_runs(agent)
        agent = _locked(agent)
        if agent.status != AgentStatus.TERMINATED:
            previous = agent.status
            agent.status, agent.pause_reason = AgentStatus.TERMINATED, ""
            agent.save(update_fields=["status", "pause_reason", "updated_at"])
            revoked = AgentApiKey.objects.filter(agent=agent, revoked_at__isnull=True).update(
                revoked_at=timezone.now())
            activity_record(actor=actor, company_id=agent.company_id, action="agent.terminated",
                            entity_type="agent", entity_id=agent.pk, details={"from": previous, "revokedKeys": revoked})
        _stop_live_runs(actor, live, "agent_terminated")
    return agent


def agent_delete(*, actor: Actor, agent: Agent) -> None:
    """Board only: purge the agent with its runs, wakes, keys and cost events; issues it was
    assigned or created keep their rows (unassigned). Refused (409) while retained history names
    the agent: what it wrote (comments, attachments, document revisions: RESTRICT) and another
    app's (``events.agent_purging_atomic``: case handoffs); terminate it instead. Also refused while
    it has a live run (stop it, or terminate the agent, first)."""
    actor.ensure_board()
    actor.ensure_can_write(agent.company_id)
    with transaction.atomic():
        live = _lock_live_runs(agent)
        agent = _locked(agent)
        events.agent_purging_atomic.send(sender=None, agent=agent)
        if live:
            raise Conflict("The agent has a live run; stop it (or terminate the agent) before deleting it.",
                           code="agent_run_active",
                           details={"agentId": str(agent.pk), "liveRunIds": [str(run.pk) for run in live]})
        activity_record(actor=actor, company_id=agent.company_id, action="agent.deleted", entity_type="agent",
                        entity_id=agent.pk, details={"name": agent.name, "status": agent.status})
        with unless_held("The agent is named by history that is kept (what it wrote); terminate it instead.",
                         "agent_delete_restricted", agentId=str(agent.pk)):
            agent.delete()


def agent_heartbeat_invoke(*, actor: Actor, agent: Agent) -> WakeupRequest:
    """``POST /agents/{id}/heartbeat/invoke``: an on-demand wake through ``agent_wakeup`` (the same
    service as ``/wakeup``); an agent invokes only itself."""
    ensure_may_invoke(actor, agent)
    with transaction.atomic():
        wake = agent_wakeup(actor=actor, agent=agent, source=WakeSource.ON_DEMAND)
        activity_record(actor=actor, company_id=agent.company_id, action="heartbeat.invoked", entity_type="agent",
                        entity_id=agent.pk, run=wake.run, details={"wakeupId": str(wake.pk), "status": wake.status})
    return wake


def agent_key_revoke(*, actor: Actor, agent: Agent, key_id) -> AgentApiKey:
    """Board only: revoke one of the agent's long-lived keys (another agent's, or a run-scoped key,
    is a 404 ``Key not found``); revoking a revoked key changes nothing."""
    with transaction.atomic():
        key = AgentApiKey.objects.select_for_update().filter(agent=agent, run__isnull=True, pk=key_id).first()
        if key is None:  # before the board check: another company's key is a 404 for every caller
            raise NotFound("Key not found")
        actor.ensure_board()
        actor.ensure_can_write(agent.company_id)
        if key.revoked_at is None:
            key.revoked_at = timezone.now()
            key.save(update_fields=["revoked_at", "updated_at"])
            activity_record(actor=actor, company_id=agent.company_id, action="agent_key.revoked",
                            entity_type="agent_api_key", entity_id=key.pk, details={"prefix": key.prefix})
    return key
