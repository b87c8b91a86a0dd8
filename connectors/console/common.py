"""What every connector console module shares: the role that manages connectors, the instance a request
names (another company's is a 404), its page URL, and the idempotency keys of rendered forms."""
from __future__ import annotations

import uuid

from django.urls import reverse

from connectors.models import ConnectorInstance
from issues.console.base import adopt_company
from issues.console.permissions import ADMIN, console_actor
from issues.selectors import scoped_get

MANAGE_CONNECTORS = ADMIN


def instance_for(request, instance_id) -> ConnectorInstance:
    instance = scoped_get(ConnectorInstance.objects.select_related("company", "project", "triage_agent"),
                          console_actor(request), instance_id, "Connector")
    adopt_company(request, instance.company)
    return instance


def instance_url(instance) -> str:
    return reverse("connectors_console:instance-detail", args=[instance.pk])


def new_key() -> str:
    """A fresh idempotency key per rendered form: a double submit acts once."""
    return f"console-{uuid.uuid4()}"


def form_key(request) -> str:
    """The key the submitted form carried (a fresh one when it carried none)."""
    return (request.POST.get("idempotency_key") or "").strip() or new_key()
