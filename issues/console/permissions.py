"""Membership roles in the console.

viewer   reads only;
operator acts on issues, interactions, cases and workflow definitions;
admin    also manages agents, their API keys and adapter configuration, and the company's settings
         (owner likewise; only an owner deletes the company).

A superuser counts as owner of every company (as ``issues.actors.Actor`` does). A role check that
fails renders the console's 403 page; the services check write roles again (``ensure_can_write``).
"""
from __future__ import annotations

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render
from django.views.decorators.http import require_POST

from issues.actors import Actor
from issues.choices import MemberRole
from issues.exceptions import Forbidden, NotFound

VIEWER, OPERATOR, ADMIN, OWNER = MemberRole.VIEWER, MemberRole.OPERATOR, MemberRole.ADMIN, MemberRole.OWNER
RANK = {VIEWER: 0, OPERATOR: 1, ADMIN: 2, OWNER: 3}

# What each kind of console action needs.
ACT_ON_WORK = OPERATOR  # issues, comments, interactions, cases, workflow definitions
MANAGE_AGENTS = ADMIN  # agents, API keys, adapter configuration
MANAGE_COMPANY = ADMIN  # the company's settings, branding and archiving


class RoleRequired(Forbidden):
    code = "role_required"


def console_actor(request) -> Actor:
    """The board user behind this console request (cached on the request)."""
    actor = getattr(request, "_console_actor", None)
    if actor is None:
        actor = request._console_actor = Actor(user=request.user)
    return actor


def role_in(request, company_id) -> str | None:
    """The user's role in ``company_id`` (``None`` when not a member)."""
    roles = console_actor(request).roles
    return roles.get(company_id) or roles.get(str(company_id))


def has_role(request, company_id, minimum: str) -> bool:
    role = role_in(request, company_id)
    return role is not None and RANK.get(role, -1) >= RANK[minimum]


def require_role(request, company_id, minimum: str):
    if role_in(request, company_id) is None:
        raise NotFound("Company not found.")
    if not has_role(request, company_id, minimum):
        raise RoleRequired(f"This needs the {minimum} role or higher in this company.",
                           details={"required": minimum, "role": role_in(request, company_id)})


def can(request, company) -> dict:
    """Template flags for the current user in ``company``."""
    if company is None:
        return {"act": False, "manage_agents": False, "manage_company": False, "role": None}
    return {
        "role": role_in(request, company.pk),
        "act": has_role(request, company.pk, ACT_ON_WORK),
        "manage_agents": has_role(request, company.pk, MANAGE_AGENTS),
        "manage_company": has_role(request, company.pk, MANAGE_COMPANY),
    }


def forbidden_page(request, exc: Forbidden):
    return render(request, "console/403.html", {"message": exc.message, "details": exc.details}, status=403)


def console_page(view):
    """Login required; a domain NotFound is a 404 and a Forbidden is the console's 403 page."""

    @login_required
    @wraps(view)
    def wrapped(request, *args, **kwargs):
        try:
            return view(request, *args, **kwargs)
        except NotFound as exc:
            raise Http404(exc.message) from exc
        except Forbidden as exc:
            return forbidden_page(request, exc)

    return wrapped


def console_action(view):
    """A POST-only console page (same error handling as ``console_page``)."""
    return console_page(require_POST(view))
