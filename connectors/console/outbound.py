"""Console actions on the write outbox (§13.3): replay a parked or failed outbound write, or all of
an instance's, from the health page. Operators and up; the service writes the audit entry."""
from __future__ import annotations

from connectors import selectors as api_selectors
from connectors.services.outbound_replay import effect_replay, instance_outbound_replay
from issues.console.base import adopt_company, perform, safe_next
from issues.console.permissions import ACT_ON_WORK, console_action, console_actor, require_role

from .common import instance_url
from .common import form_key as _key
from .common import instance_for as _instance


@console_action
def outbound_replay_view(request, effect_id):
    actor = console_actor(request)
    effect = api_selectors.outbound_effect_get(actor=actor, pk=effect_id)
    adopt_company(request, effect.instance.company)
    require_role(request, effect.company_id, ACT_ON_WORK)
    return perform(request, lambda: effect_replay(actor=actor, effect=effect, idempotency_key=_key(request)),
                   success=f"Outbound write #{effect.pk}: " + "{result[outcome]}.",
                   redirect_to=safe_next(request, instance_url(effect.instance) + "#outbound"))


@console_action
def outbound_replay_all_view(request, instance_id):
    instance = _instance(request, instance_id)
    require_role(request, instance.company_id, ACT_ON_WORK)
    return perform(request, lambda: instance_outbound_replay(actor=console_actor(request), instance=instance,
                                                             idempotency_key=_key(request)),
                   success="{result[replayedCount]} outbound write(s) queued for replay.",
                   redirect_to=safe_next(request, instance_url(instance) + "#outbound"))
