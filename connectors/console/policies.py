"""Console forms for the §7.4 policies: the connector's close and reopen policies (health page) and a
link's own close policy (the issue page's link panel). Owners and admins, like the API; each calls the
same service as the API (``instance_update`` / ``link_close_policy_set``), which writes the audit entry."""
from __future__ import annotations

from django.urls import reverse

from connectors.choices import ClosePolicy, ReopenPolicy
from connectors.models import TaskLink
from connectors.services.close_reopen import link_close_policy_set
from connectors.services.instances import instance_update
from issues.console.base import adopt_company, perform, safe_next
from issues.console.permissions import console_action, console_actor, require_role
from issues.exceptions import InvalidInput
from issues.selectors import scoped_get

from .common import MANAGE_CONNECTORS, instance_url
from .common import instance_for as _instance

CLOSE_CHOICES = ClosePolicy.choices
REOPEN_CHOICES = ReopenPolicy.choices
LINK_CLOSE_CHOICES = [("", "Connector default"), *ClosePolicy.choices]


def _choice(request, name: str, allowed, label: str) -> str:
    value = (request.POST.get(name) or "").strip()
    if value not in [c[0] for c in allowed]:
        raise InvalidInput(f"{label}: choose one of the listed options.", details={name: ["Not a valid choice."]})
    return value


@console_action
def instance_policies_view(request, instance_id):
    instance = _instance(request, instance_id)
    require_role(request, instance.company_id, MANAGE_CONNECTORS)

    def apply():
        changes = {"close_policy": _choice(request, "close_policy", CLOSE_CHOICES, "Close policy"),
                   "reopen_policy": _choice(request, "reopen_policy", REOPEN_CHOICES, "Reopen policy")}
        return instance_update(actor=console_actor(request), instance=instance, changes=changes)

    return perform(request, apply, success=f"{instance.name}: close and reopen policies saved.",
                   redirect_to=safe_next(request, instance_url(instance)))


@console_action
def link_close_policy_view(request, link_id):
    actor = console_actor(request)
    link = scoped_get(TaskLink.objects.select_related("instance", "issue", "company"), actor, link_id, "Link")
    adopt_company(request, link.company)
    require_role(request, link.company_id, MANAGE_CONNECTORS)
    back = reverse("console:issue-detail", args=[link.issue.identifier]) + "#link-panel"

    def apply():
        return link_close_policy_set(actor=actor, link=link, close_policy=_choice(
            request, "close_policy", LINK_CLOSE_CHOICES, "Close policy"))

    return perform(request, apply, success=f"Close policy of {link.external_key or link.external_task_id} saved.",
                   redirect_to=safe_next(request, back))
