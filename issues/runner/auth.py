"""Runner credentials: ``Authorization: Bearer <key>`` where the key is the run-scoped
AgentApiKey the host issued for the run (``issues.adapters.base.issue_run_key``). Nothing else
authenticates on ``/api/runner/v1/``: no session, no board key, no long-lived agent key.

``run_finish`` revokes a run's keys when the run ends, but the batch that carried
``run.terminal`` may have lost its ACK on the way back; the runner resends it. So a key revoked
*by the run's end* (``revoked_at >= finished_at``) still authenticates for
``RUNNER_ACK_GRACE_SECONDS`` after the run finished, marked ``key.runner_grace = True``; the
views then allow only what cannot change an ended run (re-ACKs, command results). A key revoked
before its run ended (an operator revoking it) never comes back.
"""
from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from issues.api.auth import LAST_USED_RESOLUTION, REFUSED_AGENT_STATUSES, bearer_token
from issues.choices import LIVE_RUN_STATUSES
from issues.exceptions import Forbidden, NotFound
from issues.models import AgentApiKey
from issues.models.agent import hash_key
from issues.models.board_key import BOARD_KEY_PREFIX


def _runner_key_required():
    return Forbidden("The runner API takes the run's own run-scoped key only.", code="runner_key_required")


def grace_seconds() -> int:
    return int(settings.PAPERCLIP.get("RUNNER_ACK_GRACE_SECONDS", 600))


def _within_grace(key: AgentApiKey, now) -> bool:
    run = key.run
    if run.status in LIVE_RUN_STATUSES or run.finished_at is None:
        return False  # revoked while the run lives: an operator's revocation
    return key.revoked_at >= run.finished_at and now - run.finished_at <= timedelta(seconds=grace_seconds())


class RunnerKeyAuthentication(authentication.BaseAuthentication):
    """The run's key: ``request.user`` is the run's agent, ``request.auth`` the key (its ``run``
    loaded, ``runner_grace`` set). Which run the path names is checked by the view (another
    run's id is a 404, like any object the caller may not see)."""

    def authenticate(self, request):
        token = bearer_token(request)
        if token is None:
            return None  # -> 401 (NotAuthenticated, with WWW-Authenticate)
        if token.startswith(BOARD_KEY_PREFIX):
            raise _runner_key_required()
        key = AgentApiKey.objects.select_related("agent", "run").filter(key_hash=hash_key(token)).first()
        if key is None:
            raise exceptions.AuthenticationFailed("Invalid API key.")
        if key.run_id is None:
            raise _runner_key_required()  # a valid agent key, but not a runner credential
        refused = REFUSED_AGENT_STATUSES.get(key.agent.status)
        if refused:
            raise exceptions.AuthenticationFailed(refused)
        now = timezone.now()
        key.runner_grace = False
        if key.revoked_at is not None:
            if not _within_grace(key, now):
                raise exceptions.AuthenticationFailed("This run-scoped key has been revoked.")
            key.runner_grace = True
        if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
            AgentApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        return key.agent, key

    def authenticate_header(self, request):
        return 'Bearer realm="runner"'


def runner_key_run(request, run_id):
    """The run the path names, when it is the key's own run; any other run (another run of the
    same agent, another company's) is a 404 in the one error shape."""
    key = request.auth
    if key is None or str(key.run_id) != str(run_id):
        raise NotFound("Run not found.")
    return key.run


class RunnerKeyScheme(OpenApiAuthenticationExtension):
    target_class = "issues.runner.auth.RunnerKeyAuthentication"
    name = "runnerKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer",
                "description": "The run's run-scoped key (the one the host issued for this run)."}
