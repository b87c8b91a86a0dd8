"""Who is acting: an agent (API key + run header) or a board user (session or board API key +
membership role).

The run header (``X-Paperclip-Run-Id``) of an agent names either one of the agent's host runs
(:attr:`Actor.run`: it must be live for a mutation) or, with a long-lived key, anything else: the
client's own run id (:attr:`Actor.client_run_id`), recorded on activity rows and locks but never a
host run, so it is never live (upstream trusts it as given; §2.3 of the reference). A board user's
header is only ever recorded.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from functools import cached_property

from django.utils import timezone

from issues.choices import LIVE_RUN_STATUSES, WRITE_ROLES, ActorType, RunStatus
from issues.exceptions import Conflict, Forbidden, InvalidInput, NotFound, Unauthorized
from issues.models import Agent, BoardApiKey, Company, HeartbeatRun, Membership

RUN_HEADER = "X-Paperclip-Run-Id"


@dataclass
class Actor:
    agent: Agent | None = None
    user: object | None = None
    run_header: str | None = None
    system: bool = False
    # The board API key a board request was made with (recorded on every activity row it writes).
    board_key: BoardApiKey | None = None
    _run: HeartbeatRun | None = field(default=None, repr=False)
    _client_run_id: uuid.UUID | None = field(default=None, repr=False)

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

    def ensure_board(self, message: str = "Board access required") -> None:
        """Board-only operations (upstream's ``assertBoard``): an agent gets the 403 ``board_only``;
        board users pass (their role is checked by ensure_can_write), and so does the host."""
        if self.is_agent or not (self.is_board or self.system):
            raise Forbidden(message, code="board_only")

    def ensure_can_write(self, company_id):
        if self.is_board and self.roles.get(company_id) not in WRITE_ROLES:
            raise Forbidden("Your role in this company is read-only.", code="read_only_role")

    # --- run header -----------------------------------------------------------------------
    @property
    def run(self) -> HeartbeatRun | None:
        """The host run named by the header, validated against the agent. None for board users and
        for a long-lived key's own run id (see :attr:`client_run_id`)."""
        if self.agent is None:
            return self._run
        if self._run is None and self._client_run_id is None and self.run_header:
            self._resolve_run_header()
        return self._run

    @property
    def client_run_id(self) -> uuid.UUID | None:
        """The client's own run id: a board user's header, or an agent header naming none of the
        agent's host runs. Recorded (activity rows, the lock), never trusted as a run."""
        if self.agent is None:
            return uuid_or_none(self.run_header)
        return self._client_run_id

    def _resolve_run_header(self):
        if not self.run_header:
            raise Unauthorized("Agent run id required", code="run_id_required")  # upstream's wording (ref §2.3)
        run_id = uuid_or_none(self.run_header)
        if run_id is None:  # recorded in UUID columns, so it must be one
            raise InvalidInput(f"Invalid {RUN_HEADER} header", code="invalid_run_id",
                               details={RUN_HEADER: ["Must be a UUID."]})
        run = HeartbeatRun.objects.filter(pk=run_id, agent=self.agent).first()
        if run is None:
            self._client_run_id = run_id
        else:
            self._run = run

    def note_host_run(self, run: HeartbeatRun):
        """A statement already proved the run header names this agent's running host run (the
        checkout claim checks it): later reads use it instead of selecting the run again."""
        if self._run is None and self._client_run_id is None:
            self._run = run

    def require_live_run(self) -> HeartbeatRun | None:
        """For run-scoped agent writes (checkout, release, writes to the agent's own in_progress
        issue: ref §2.3): a header is required; when it names one of the agent's host runs,
        that run must not have ended. None for board users and for a client run id (which is never
        a live host run: the fences let the same agent adopt its own lock under another id).

        A queued run becomes running on its first use, so an agent started outside the host
        can work with the run id its wakeup returned.
        """
        if self.agent is not None and not self.run_header and self._run is None:  # (the host may pass _run)
            self._resolve_run_header()  # 401 run_id_required
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

    def named_live_run(self) -> HeartbeatRun | None:
        """For agent writes that are not run-scoped (issue creation, approvals, labels, writes
        outside the agent's own in_progress issue: ref §2.3): no header is fine (the activity row
        then names no run); a header given is checked as :meth:`require_live_run` checks it."""
        return self.require_live_run() if self.run_header or self._run is not None else None

    @property
    def run_ref(self) -> uuid.UUID | None:
        """The run id this request speaks for, host or client (for details and payloads)."""
        return self._run.pk if self._run is not None else self.client_run_id

    def activity_fields(self) -> dict:
        """The actor columns of an activity row: every service records them through
        ``activity_record``, so the run, the client's run id and the board key are never missed."""
        if self.agent is not None and self.run_header and self._run is None and self._client_run_id is None:
            try:  # a mutation that did not need a run still records the one it named
                self._resolve_run_header()
            except InvalidInput:
                pass
        return {
            "actor_type": self.actor_type,
            "actor_agent": self.agent,
            "actor_user": self.user if self.agent is None else None,
            "run": self._run,
            "client_run_id": self.client_run_id,
            "board_key": self.board_key if self.agent is None else None,
        }


SYSTEM = Actor(system=True)


def uuid_or_none(value) -> uuid.UUID | None:
    """``value`` as a UUID; None when empty or not one."""
    try:
        return uuid.UUID(str(value)) if value else None
    except ValueError:
        return None


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
        board_key = request.auth if isinstance(request.auth, BoardApiKey) else None
        actor = Actor(user=principal, board_key=board_key, run_header=request.headers.get(RUN_HEADER))
    else:
        raise Unauthorized()
    request._paperclip_actor = actor
    return actor
