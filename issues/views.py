"""The operator console: server-rendered pages, htmx swaps only the parts that change."""
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from issues.forms import CONSOLE_FILTER_FIELDS, STATUS_SUGGESTIONS, style_issue_filter_form
from issues.console.base import refs_as_form_errors
from issues.selectors import issue_filterset
from paperclip.core.middleware import SESSION_KEY

ISSUES_PER_PAGE = 50


def _wants_partial(request) -> bool:
    """An htmx swap (not a boosted navigation or a history restore) gets only the fragment."""
    htmx = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.boosted and not htmx.history_restore_request


@require_GET
def home(request):
    return redirect("console:issue-list")


@login_required
@require_GET
def issue_list(request):
    company = request.company
    context = {"company": company, "status_suggestions": STATUS_SUGGESTIONS}
    if company is not None:
        filterset = issue_filterset(company=company, params=request.GET)
        form = style_issue_filter_form(filterset.form, company=company)
        page = None
        if filterset.is_valid():
            page = Paginator(filterset.qs, ISSUES_PER_PAGE).get_page(request.GET.get("page"))
            if refs_as_form_errors(filterset, form, company.pk, page.object_list):
                page = None
        context.update(
            form=form,
            filter_fields=[form[name] for name in CONSOLE_FILTER_FIELDS],
            hidden_filters=[(name, request.GET[name]) for name in form.fields
                            if name not in CONSOLE_FILTER_FIELDS and request.GET.get(name)],
            page=page,
            issues=page.object_list if page is not None else [],
            filtered=any(request.GET.get(name) for name in form.fields),
        )
    template = "issues/_issue_rows.html" if _wants_partial(request) else "issues/issue_list.html"
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


@login_required
@require_POST
def switch_company(request):
    """Select the console's company; only the user's own companies exist here (anything else is a 404)."""
    wanted = request.POST.get("company_id", "")
    company = next((c for c in request.user_companies if str(c.pk) == wanted), None)
    if company is None:
        raise Http404("No such company.")
    request.session[SESSION_KEY] = str(company.pk)
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                           require_https=request.is_secure()):
        target = reverse("console:issue-list")
    return HttpResponseRedirect(target)
