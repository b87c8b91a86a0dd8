"""Approval pages: the company's approvals (open ones first, filtered by status) and one approval
with its payload, linked issues, requester and decision history; operators decide through
``issues.services.approvals.approval_decide`` (the API's rules, the same wake of the requester)."""
from __future__ import annotations

from django.contrib import messages
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.views.decorators.http import require_GET

from issues.choices import ApprovalStatus
from issues.selectors import (APPROVAL_OPEN_STATUSES, approval_get, approval_history, approval_issues, approval_list,
                              hired_agent)
from issues.services.approvals import approval_decide

from .base import adopt_company, perform, render_page
from .permissions import ACT_ON_WORK, console_action, console_actor, console_page, require_role

LIST_LIMIT = 200
# The form's decision -> (target status, flash message)
DECISIONS = {
    "approve": (ApprovalStatus.APPROVED, "approved"),
    "reject": (ApprovalStatus.REJECTED, "rejected"),
    "request_revision": (ApprovalStatus.REVISION_REQUESTED, "sent back for revision"),
}


def approval_url(approval) -> str:
    return reverse("console:approval-detail", args=[approval.pk])


def _approval(request, approval_id):
    approval = approval_get(actor=console_actor(request), pk=approval_id)
    adopt_company(request, approval.company)
    return approval


@console_page
@require_GET
def approval_list_page(request):
    company = request.company
    wanted = request.GET.get("status", "")
    if wanted not in ApprovalStatus.values:
        wanted = ""  # an unknown filter shows everything rather than an empty page
    approvals = list(approval_list(company=company, status=wanted or None)[:LIST_LIMIT]) if company else []
    context = {"company": company, "approvals": approvals, "status": wanted, "statuses": ApprovalStatus.choices,
               "limit": LIST_LIMIT}
    return render_page(request, "console/approvals/list.html", "console/approvals/_rows.html", context)


@console_page
@require_GET
def approval_detail(request, approval_id):
    approval = _approval(request, approval_id)
    context = {
        "company": approval.company, "approval": approval, "issues": approval_issues(approval),
        "hired_agent": hired_agent(approval),
        "history": list(approval_history(approval)), "is_open": approval.status in APPROVAL_OPEN_STATUSES,
        # request revision only from pending (upstream); approve and reject from either open status
        "can_request_revision": approval.status == ApprovalStatus.PENDING,
    }
    return render_page(request, "console/approvals/detail.html", None, context)


@console_action
def approval_decide_view(request, approval_id):
    approval = _approval(request, approval_id)
    require_role(request, approval.company_id, ACT_ON_WORK)
    decision = DECISIONS.get(request.POST.get("decision", ""))
    if decision is None:
        messages.error(request, f"decision: must be one of {', '.join(DECISIONS)}.")
        return HttpResponseRedirect(approval_url(approval))
    status, verb = decision
    note = (request.POST.get("note") or "").strip()
    return perform(
        request,
        lambda: approval_decide(actor=console_actor(request), approval=approval, status=status, note=note),
        success=f"“{approval.title}” {verb}.", redirect_to=approval_url(approval),
    )
