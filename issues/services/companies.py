import logging
import re
import unicodedata
from itertools import chain

from django.db import IntegrityError, transaction

from issues.actors import SYSTEM, Actor
from issues.choices import AgentRole, AgentStatus, MemberRole
from issues.exceptions import Conflict, Forbidden, InvalidInput
from issues.models import Agent, AgentApiKey, Company, Membership
from issues.models.agent import hash_key

from .activity import activity_record
from .agents import adapter_config_validate, ensure_can_create_agents, runtime_config_validate
from .company_stop import company_for_stop, company_stop_reason
from .deletion import unless_held
from .host_commands import adapter_command_check


audit_log = logging.getLogger("paperclip.audit")  # what outlives a company's own audit rows

PREFIX_FORMAT = re.compile(r"^[A-Z][A-Z0-9]{1,9}$")  # the company_prefix_format constraint's rule


def company_create(*, name: str, issue_prefix: str, enable_cases: bool = False, description: str = "",
                   budget_monthly_cents: int = 0, actor: Actor = SYSTEM) -> Company:
    prefix = issue_prefix.strip().upper()
    if not PREFIX_FORMAT.match(prefix):
        raise InvalidInput(details={"issuePrefix": ["2-10 letters and digits, starting with a letter (e.g. ACME)."]})
    taken = Conflict("That issue prefix is taken.", code="prefix_taken", details={"issuePrefix": [prefix]})
    if Company.objects.filter(issue_prefix=prefix).exists():
        raise taken
    try:
        with transaction.atomic():
            company = Company.objects.create(name=name, issue_prefix=prefix, enable_cases=enable_cases,
                                             description=description, budget_monthly_cents=budget_monthly_cents)
            activity_record(actor=actor, company_id=company.id, action="company.created", entity_type="company",
                            entity_id=company.id, details={"name": name, "prefix": prefix})
    except IntegrityError:
        if Company.objects.filter(issue_prefix=prefix).exists():  # committed meanwhile (the unique constraint)
            raise taken
        raise
    return company


def issue_prefix_candidates(name: str):
    """Prefixes for a company named ``name``, best first: its first three letters or digits (PAP for
    Paperclip), then PAP2, PAP3, …; a name without any gives CO, CO2, …"""
    folded = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode().upper()
    base = re.sub(r"[^A-Z0-9]", "", folded).lstrip("0123456789")[:3]
    base = base if len(base) >= 2 else (base + "CO")[:2]
    yield base
    for n in range(2, 10 ** (10 - len(base))):
        yield f"{base}{n}"


def company_found(*, actor: Actor, name: str, description: str = "", budget_monthly_cents: int = 0,
                  issue_prefix: str | None = None) -> Company:
    """``POST /api/companies`` (upstream: instance admins only): a new company whose creator becomes its
    owner. Without ``issue_prefix`` one is derived from the name (the first free candidate)."""
    actor.ensure_board()
    if not getattr(actor.user, "is_staff", False):
        raise Forbidden("Instance admin required", code="instance_admin_required")
    name = (name or "").strip()
    if not name:
        raise InvalidInput(details={"name": ["This field may not be blank."]})
    fields = {"name": name, "description": description or "", "budget_monthly_cents": budget_monthly_cents,
              "actor": actor}
    with transaction.atomic():
        if issue_prefix is not None:
            company = company_create(issue_prefix=issue_prefix, **fields)
        else:
            candidates = issue_prefix_candidates(name)
            first = next(candidates)
            taken = set(Company.objects.filter(issue_prefix__startswith=first).values_list("issue_prefix", flat=True))
            prefix = next(p for p in chain((first,), candidates) if p not in taken)
            # (a twin created at the same moment may take it first: 409 prefix_taken, and a retry gets the next)
            company = company_create(issue_prefix=prefix, **fields)
        membership_set(company=company, user=actor.user, role=MemberRole.OWNER, actor=actor)
    return company


def membership_set(*, company: Company, user, role: str = MemberRole.OWNER, actor: Actor = SYSTEM) -> Membership:
    with transaction.atomic():
        membership, _ = Membership.objects.update_or_create(company=company, user=user, defaults={"role": role})
        activity_record(actor=actor, company_id=company.id, action="membership.set", entity_type="membership",
                        entity_id=membership.id, details={"user": user.get_username(), "role": role})
    return membership


def agent_create(*, company: Company, name: str, role: str = AgentRole.GENERAL, title: str = "",
                 reports_to: Agent | None = None, adapter_type: str = "none", adapter_config=None,
                 runtime_config=None, budget_monthly_cents: int = 0, capabilities: str = "",
                 permissions: dict | None = None, icon: str = "", metadata: dict | None = None,
                 pending_approval: bool = False, actor: Actor = SYSTEM) -> Agent:
    """``permissions`` (upstream's flags) only from the board; an agent creates agents only with
    ``canCreateAgents`` (services.agents.ensure_can_create_agents). ``pending_approval``: a hire that
    waits for the board (services.agent_hires), whatever the company's stop."""
    ensure_can_create_agents(actor, company.id, sets_permissions=permissions is not None)
    if role not in AgentRole.values:
        raise InvalidInput(details={"role": [f"'{role}' is not one of {', '.join(AgentRole.values)}."]})
    if reports_to is not None and reports_to.company_id != company.id:
        raise InvalidInput(details={"reportsTo": ["No such agent in this company."]})
    adapter_config_validate(adapter_type, adapter_config or {}, company_id=company.id)
    adapter_command_check(actor, adapter_type, adapter_config or {})
    runtime_config_validate(runtime_config or {})
    try:
        with transaction.atomic():
            # (locked: a status change being committed is waited for, and its sync then sees this agent)
            stop = company_stop_reason(company_for_stop(company.pk, lock=True))
            agent = Agent.objects.create(
                company=company, name=name, role=role, title=title, reports_to=reports_to,
                adapter_type=adapter_type, adapter_config=adapter_config or {},
                runtime_config=runtime_config or {}, budget_monthly_cents=budget_monthly_cents,
                capabilities=capabilities, permissions=dict(permissions or {}), icon=icon or "",
                metadata=dict(metadata or {}),
                # born into a stopped company: paused with its reason, resumed when the stop lifts
                **({"status": AgentStatus.PENDING_APPROVAL} if pending_approval
                   else {"status": AgentStatus.PAUSED, "pause_reason": stop} if stop else {}),
            )
            activity_record(actor=actor, company_id=company.id, action="agent.created", entity_type="agent",
                            entity_id=agent.id, details={"name": name, "role": role})
    except IntegrityError:
        raise Conflict("An agent with that name exists in this company.", code="agent_name_taken",
                       details={"name": [name]})
    return agent


def agent_api_key_create(*, agent: Agent, name: str = "default", actor: Actor = SYSTEM) -> tuple[AgentApiKey, str]:
    """Returns the key row and the raw key; the raw key is shown once and never stored. Board users
    (with a write role) and the host mint keys; agents never do."""
    actor.ensure_board()
    actor.ensure_can_write(agent.company_id)
    if agent.status == AgentStatus.TERMINATED:
        raise Conflict("A terminated agent gets no new keys.", code="agent_terminated")
    raw = AgentApiKey.generate()
    with transaction.atomic():
        key = AgentApiKey.objects.create(agent=agent, name=name, prefix=raw[:12], key_hash=hash_key(raw))
        activity_record(actor=actor, company_id=agent.company_id, action="agent_key.created",
                        entity_type="agent_api_key", entity_id=key.id, details={"prefix": key.prefix})
    return key, raw


def company_delete(*, actor: Actor, company: Company) -> None:
    """Upstream's ``DELETE /api/companies/{id}`` (board only): the company and everything in it — its
    issues with their threads and files, agents, runs, cases, connectors and its audit trail. Only an
    owner deletes, and only an archived company (archiving stops its agents and cancels their runs):
    409 ``company_not_archived`` until then, 409 ``company_run_active`` while a cancelled run's
    process is still ending. The audit rows go with the company, so the deletion is logged by the
    server (``paperclip.audit``)."""
    from issues.choices import LIVE_RUN_STATUSES, CompanyStatus
    from issues.models import HeartbeatRun, Interaction

    actor.ensure_board()
    if actor.roles.get(company.pk) != MemberRole.OWNER:
        raise Forbidden("Only an owner of the company may delete it.", code="owner_required")
    with transaction.atomic():
        company = Company.objects.select_for_update().get(pk=company.pk)
        if company.status != CompanyStatus.ARCHIVED:
            raise Conflict("Archive the company before deleting it.", code="company_not_archived",
                           details={"status": [company.status]})
        live = [str(pk) for pk in HeartbeatRun.objects.filter(company=company, status__in=LIVE_RUN_STATUSES)
                .order_by("created_at").values_list("pk", flat=True)]
        if live:
            raise Conflict("The company still has live runs; wait for them to end.", code="company_run_active",
                           details={"liveRunIds": live})
        record = (company.pk, company.name, company.issue_prefix,
                  {"issues": company.issues.count(), "agents": company.agents.count()})
        with unless_held("The company is still referenced elsewhere.", "company_delete_restricted"):
            # Interactions first: they protect the document revisions they point at.
            Interaction.objects.filter(company=company).delete()
            company.delete()
    pk, name, prefix, counts = record
    audit_log.warning("company %s (%s, %s) deleted by user %s: %s", pk, name, prefix, getattr(actor.user, "pk", None),
                      counts)
