import uuid
from datetime import timedelta

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from issues.actors import RUN_HEADER
from issues.choices import LIVE_RUN_STATUSES, AgentStatus
from issues.models import AgentApiKey, HeartbeatRun
from issues.models.agent import hash_key
from issues.services.runs import run_touch_activity

# last_used_at is bookkeeping; writing it on every request would turn reads into writes.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class AgentKeyAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <key>``: the key's agent becomes ``request.user``."""

    keyword = "bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1").split()
        if not header or header[0].lower() != self.keyword:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header.")
        key = (
            AgentApiKey.objects.select_related("agent")
            .filter(key_hash=hash_key(header[1]), revoked_at__isnull=True)
            .first()
        )
        if key is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked API key.")
        if key.agent.status == AgentStatus.TERMINATED:
            raise exceptions.AuthenticationFailed("This agent has been terminated.")
        now = timezone.now()
        # Any request made from a run keeps it alive (throttled; the write also proves a
        # run-scoped key's run is live, so the check below is only needed when nothing was written).
        run_id = key.run_id or _header_run_id(request)
        touched = run_id is not None and run_touch_activity(run_id=run_id, agent_id=key.agent_id, now=now)
        if key.run_id and not touched and not HeartbeatRun.objects.filter(
                pk=key.run_id, status__in=LIVE_RUN_STATUSES).exists():
            raise exceptions.AuthenticationFailed("This run-scoped key's run has ended.")
        if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
            AgentApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        return key.agent, key

    def authenticate_header(self, request):
        return 'Bearer realm="api"'


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
