"""Shared pieces of the console views: partial rendering, the company of an object, action outcomes."""
from __future__ import annotations

from django.contrib import messages
from django.http import HttpResponseRedirect
from django.shortcuts import render
from django.utils.cache import patch_vary_headers
from django.utils.http import url_has_allowed_host_and_scheme

from issues.exceptions import ApiError, Forbidden, NotFound
from paperclip.core.errors import error_text
from paperclip.core.middleware import SESSION_KEY

from .permissions import can


def wants_partial(request) -> bool:
    """An htmx swap (not a boosted navigation or a history restore) gets only the fragment."""
    htmx = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.boosted and not htmx.history_restore_request


def render_page(request, full_template: str, partial_template: str | None, context: dict, status: int = 200):
    """The whole page, or only ``partial_template`` for an htmx swap; varies on HX-Request."""
    template = partial_template if partial_template and wants_partial(request) else full_template
    company = context.get("company", getattr(request, "company", None))
    context.setdefault("perms_here", can(request, company))
    response = render(request, template, context, status=status)
    patch_vary_headers(response, ("HX-Request",))
    return response


def adopt_company(request, company):
    """Show an object of another of the user's companies under that company (deep links work)."""
    if request.company is None or request.company.pk != company.pk:
        request.company = company
        request.session[SESSION_KEY] = str(company.pk)


def safe_next(request, fallback: str) -> str:
    target = request.POST.get("next") or ""
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                                  require_https=request.is_secure()):
        return target
    return fallback


def perform(request, action, *, success: str, redirect_to: str):
    """Run a service call; flash the outcome and redirect (PRG). Domain errors become a flash
    message, except NotFound (404) and Forbidden (403 page), which propagate."""
    try:
        result = action()
    except (NotFound, Forbidden):
        raise
    except ApiError as exc:
        messages.error(request, error_text(exc))
        return HttpResponseRedirect(redirect_to)
    if success:
        messages.success(request, success.format(result=result) if "{result" in success else success)
    return HttpResponseRedirect(redirect_to)


def refs_as_form_errors(filterset, form, company_id, rows) -> bool:
    """An empty page whose filters name another company's object (or none) gets the API's 404 reason
    as the form's errors, so the page says so instead of "no issues"; True when it did."""
    from issues.selectors import refs_checked

    try:
        refs_checked(filterset, company_id, list(rows))
    except NotFound as exc:
        for name, reasons in exc.details.items():
            form.add_error(name if name in form.fields else None, reasons)
        return True
    return False
