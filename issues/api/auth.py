"""API credentials: ``Authorization: Bearer pcp_board_…`` (a board user's key) and ``Bearer pcp_…``
(an agent's key). Board keys are tried first and recognised by their prefix, so a board key is
never looked up as an agent key; the session comes last (DRF enforces CSRF only for it)."""
import uuid
from datetime import timedelta
from functools import lru_cache

from django.db import connection
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from issues.actors import RUN_HEADER
from issues.choices import LIVE_RUN_STATUSES, AgentStatus
from issues.models import Agent, AgentApiKey, BoardApiKey, HeartbeatRun
from issues.models.agent import hash_key
from issues.models.board_key import BOARD_KEY_PREFIX
from issues.services.runs import run_touch_activity
from paperclip.core import rows

# Statuses whose agent is not authenticated at all (ref §2: terminated and pending_approval agents).
REFUSED_AGENT_STATUSES = {AgentStatus.TERMINATED: "This agent has been terminated.",
                          AgentStatus.PENDING_APPROVAL: "This agent is waiting for the board to approve its hire."}

# last_used_at is bookkeeping; writing it on every request would turn reads into writes.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def bearer_token(request) -> str | None:
    """The token of ``Authorization: Bearer <token>``; None without one (401 when malformed)."""
    header = authentication.get_authorization_header(request).decode("latin-1").split()
    if not header or header[0].lower() != "bearer":
        return None
    if len(header) != 2:
        raise exceptions.AuthenticationFailed("Malformed Authorization header.")
    return header[1]


def _touch_last_used(model, key, now):
    if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
        model.objects.filter(pk=key.pk).update(last_used_at=now)


class BoardKeyAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer pcp_board_…``: the key's user becomes ``request.user`` (their
    memberships and roles); ``request.auth`` is the key. Expired or revoked keys are a 401."""

    def authenticate(self, request):
        token = bearer_token(request)
        if token is None or not token.startswith(BOARD_KEY_PREFIX):
            return None
        key = BoardApiKey.objects.select_related("user").filter(key_hash=hash_key(token)).first()
        now = timezone.now()
        if key is None or not key.user.is_active:
            raise exceptions.AuthenticationFailed("Invalid board API key.")
        if key.revoked_at is not None:
            raise exceptions.AuthenticationFailed("This board API key has been revoked.")
        if key.expires_at is not None and key.expires_at <= now:
            raise exceptions.AuthenticationFailed("This board API key has expired.")
        _touch_last_used(BoardApiKey, key, now)
        return key.user, key

    def authenticate_header(self, request):
        return 'Bearer realm="api"'


class AgentKeyAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <key>``: the key's agent becomes ``request.user``."""

    keyword = "bearer"

    def authenticate(self, request):
        token = bearer_token(request)
        if token is None or token.startswith(BOARD_KEY_PREFIX):
            return None  # board keys are BoardKeyAuthentication's
        key = agent_key_lookup(hash_key(token))
        if key is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked API key.")
        refused = REFUSED_AGENT_STATUSES.get(key.agent.status)
        if refused:
            raise exceptions.AuthenticationFailed(refused)
        now = timezone.now()
        # Any request made from a run keeps it alive (throttled; the write also proves a
        # run-scoped key's run is live, so the check below is only needed when nothing was written).
        # A long-lived key's own run id names no host run: nothing is touched.
        run_id = key.run_id or _header_run_id(request)
        touched = run_id is not None and run_touch_activity(run_id=run_id, agent_id=key.agent_id, now=now)
        if key.run_id and not touched and not HeartbeatRun.objects.filter(
                pk=key.run_id, status__in=LIVE_RUN_STATUSES).exists():
            raise exceptions.AuthenticationFailed("This run-scoped key's run has ended.")
        _touch_last_used(AgentApiKey, key, now)
        return key.agent, key

    def authenticate_header(self, request):
        return 'Bearer realm="api"'


@lru_cache(maxsize=None)
def _key_lookup_sql() -> str:
    qn = connection.ops.quote_name
    return (f"SELECT {rows.select_list(AgentApiKey, 'k')}, {rows.select_list(Agent, 'a')} "
            f"FROM {qn(AgentApiKey._meta.db_table)} k JOIN {qn(Agent._meta.db_table)} a ON a.id = k.agent_id "
            f"WHERE k.key_hash = %s AND k.revoked_at IS NULL")  # key_hash is unique: no LIMIT, no ORDER BY


def agent_key_lookup(key_hash: str) -> AgentApiKey | None:
    """The unrevoked key with this hash and its agent, in one statement built once (every agent
    request starts here)."""
    row = rows.fetch_row(_key_lookup_sql(), [key_hash])
    if row is None:
        return None
    key, agent = rows.split(row, AgentApiKey, Agent)
    AgentApiKey.agent.field.set_cached_value(key, agent)
    return key


def _header_run_id(request) -> uuid.UUID | None:
    """The run named by the run header, when it is a well-formed id (the actor validates it)."""
    try:
        return uuid.UUID(request.headers.get(RUN_HEADER) or "")
    except ValueError:
        return None


class AgentKeyScheme(OpenApiAuthenticationExtension):
    target_class = "issues.api.auth.AgentKeyAuthentication"
    name = "agentKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "Agent API key (pcp_…)"}


class BoardKeyScheme(OpenApiAuthenticationExtension):
    target_class = "issues.api.auth.BoardKeyAuthentication"
    name = "boardKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer",
                "description": "Board API key (pcp_board_…): acts as its user, no CSRF, no run header."}
