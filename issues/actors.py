"""Who is acting: an agent (API key + run header) or a board user (session + membership role)."""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from functools import cached_property

from django.utils import timezone

from issues.choices import LIVE_RUN_STATUSES, WRITE_ROLES, ActorType, RunStatus
from issues.exceptions import Conflict, Forbidden, NotFound, Unauthorized
from issues.models import Agent, Company, HeartbeatRun, Membership

RUN_HEADER = "X-Paperclip-Run-Id"


@dataclass
class Actor:
    agent: Agent | None = None
    user: object | None = None
    run_header: str | None = None
    system: bool = False
    _run: HeartbeatRun | None = field(default=None, repr=False)

    # --- identity -----------------------------------------------------------------------
    @property
    def is_agent(self) -> bool:
        return self.agent is not None

    @property
    def is_board(self) -> bool:
        return self.user is not None and self.agent is None

    @property
    def actor_type(self) -> str:
        if self.agent is not None:
            return ActorType.AGENT
        if self.user is not None:
            return ActorType.USER
        return ActorType.SYSTEM

    # --- scope ----------------------------------------------------------------------------
    @cached_property
    def roles(self) -> dict:
        """company id -> role for a board user (superusers own everything)."""
        if self.user is None or self.agent is not None:
            return {}
        if getattr(self.user, "is_superuser", False):
            return {cid: "owner" for cid in Company.objects.values_list("id", flat=True)}
        return dict(Membership.objects.filter(user=self.user).values_list("company_id", "role"))

    @property
    def company_ids(self):
        if self.system:
            return None
        if self.agent is not None:
            return [self.agent.company_id]
        return list(self.roles)

    def company(self, company_id) -> Company:
        """The company if the actor may see it; anything else is a 404."""
        if not self.system and str(company_id) not in {str(c) for c in self.company_ids}:
            raise NotFound("Company not found.")
        try:
            return Company.objects.get(pk=company_id)
        except (Company.DoesNotExist, ValueError):
            raise NotFound("Company not found.")

    def ensure_can_write(self, company_id):
        if self.is_board and self.roles.get(company_id) not in WRITE_ROLES:
            raise Forbidden("Your role in this company is read-only.", code="read_only_role")

    # --- run header -----------------------------------------------------------------------
    @property
    def run(self) -> HeartbeatRun | None:
        """The run named by the header, validated against the agent; None for board users."""
        if self.agent is None:
            return self._run
        if self._run is None:
            if not self.run_header:
                raise Unauthorized(f"Agent mutations must carry the {RUN_HEADER} header.", code="run_id_required")
            try:
                run_id = uuid.UUID(self.run_header)
            except ValueError:
                raise Forbidden(f"{RUN_HEADER} is not a run of this agent.", code="run_mismatch")
            run = HeartbeatRun.objects.filter(pk=run_id, agent=self.agent).first()
            if run is None:
                raise Forbidden(f"{RUN_HEADER} is not a run of this agent.", code="run_mismatch")
            self._run = run
        return self._run

    def require_live_run(self) -> HeartbeatRun | None:
        """For agent mutations: the run must exist, be this agent's, and not have ended.

        A queued run becomes running on its first use, so an agent started outside the host
        can work with the run id its wakeup returned.
        """
        run = self.run
        if run is None:
            return None
        if run.status not in LIVE_RUN_STATUSES:
            raise Conflict("The run named by the run header has ended.", code="run_not_live",
                           details={"runId": str(run.id), "status": run.status})
        if run.status != RunStatus.RUNNING:
            now = timezone.now()
            HeartbeatRun.objects.filter(pk=run.pk, status__in=LIVE_RUN_STATUSES).exclude(
                status=RunStatus.RUNNING
            ).update(status=RunStatus.RUNNING, started_at=now, updated_at=now)
            run.status, run.started_at = RunStatus.RUNNING, now
        return run

    def activity_fields(self) -> dict:
        return {
            "actor_type": self.actor_type,
            "actor_agent": self.agent,
            "actor_user": self.user if self.agent is None else None,
            "run": self._run,
        }


SYSTEM = Actor(system=True)


def actor_from_request(request) -> Actor:
    cached = getattr(request, "_paperclip_actor", None)
    if cached is not None:
        return cached
    principal = request.user
    if isinstance(principal, Agent):
        header = request.headers.get(RUN_HEADER)
        key_run = getattr(request.auth, "run_id", None)
        if key_run is not None:
            # A run-scoped key implies its run and can speak for no other.
            if header and header != str(key_run):
                raise Forbidden(f"{RUN_HEADER} does not match this run-scoped key.", code="run_mismatch")
            header = str(key_run)
        actor = Actor(agent=principal, run_header=header)
    elif principal is not None and principal.is_authenticated:
        actor = Actor(user=principal)
    else:
        raise Unauthorized()
    request._paperclip_actor = actor
    return actor
