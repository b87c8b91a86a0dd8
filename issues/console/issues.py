"""Issue pages: the board view of the filtered list, the issue page (thread, documents, attachments,
runs, interactions) and the operator actions on it. The list itself is ``issues.views.issue_list``."""
from __future__ import annotations

import difflib

from django.contrib import messages
from django.http import Http404, HttpResponseRedirect
from django.urls import reverse
from django.views.decorators.http import require_GET

from issues.choices import InteractionStatus, IssuePriority, IssueStatus
from issues.forms import CONSOLE_FILTER_FIELDS, STATUS_SUGGESTIONS, style_issue_filter_form
from issues.models import Interaction
from issues.selectors import (
    assignable_agents,
    attachment_get,
    attachment_list,
    document_get,
    document_revisions,
    issue_detail as issue_detail_read,
    issue_filterset,
    issue_thread,
    run_log_tail,
    scoped_get,
)
from issues.services.attachments import attachment_create, attachment_delete
from issues.services.checkout import issue_force_release
from issues.services.issues import issue_update
from issues.services.thread import comment_create, document_delete, interaction_respond
from paperclip.core.uploads import max_upload_bytes, one_uploaded_file

from .base import adopt_company, perform, refs_as_form_errors, render_page
from .panels import issue_panels
from .permissions import ACT_ON_WORK, console_action, console_actor, console_page, require_role
from .runs import POLL_EVERY

BOARD_LIMIT = 500
LIVE_TAIL = 30  # log lines of the live run shown on the issue page
BOARD_COLUMNS = [IssueStatus.BACKLOG, IssueStatus.TODO, IssueStatus.IN_PROGRESS, IssueStatus.IN_REVIEW,
                 IssueStatus.BLOCKED, IssueStatus.DONE, IssueStatus.CANCELLED]


def _issue(request, ref):
    issue = issue_detail_read(actor=console_actor(request), pk=ref)
    adopt_company(request, issue.company)
    return issue


def issue_url(issue) -> str:
    return reverse("console:issue-detail", args=[issue.identifier])


# --- board --------------------------------------------------------------------------------------------


@console_page
@require_GET
def issue_board(request):
    """The same FilterSet as the list and the API, laid out in status columns."""
    company = request.company
    context = {"company": company, "status_suggestions": STATUS_SUGGESTIONS}
    if company is not None:
        filterset = issue_filterset(company=company, params=request.GET)
        form = style_issue_filter_form(filterset.form, company=company)
        issues = list(filterset.qs[:BOARD_LIMIT]) if filterset.is_valid() else []
        if filterset.is_valid() and refs_as_form_errors(filterset, form, company.pk, issues):
            issues = []
        columns = {status: [] for status in BOARD_COLUMNS}
        for issue in issues:
            columns.setdefault(issue.status, []).append(issue)
        context.update(
            form=form,
            filter_fields=[form[name] for name in CONSOLE_FILTER_FIELDS],
            hidden_filters=[(name, request.GET[name]) for name in form.fields
                            if name not in CONSOLE_FILTER_FIELDS and request.GET.get(name)],
            columns=[(status, IssueStatus(status).label, columns[status]) for status in BOARD_COLUMNS],
            truncated=len(issues) >= BOARD_LIMIT,
            total=len(issues),
            filtered=any(request.GET.get(name) for name in form.fields),
        )
    return render_page(request, "console/issues/board.html", "console/issues/_board.html", context)


# --- the issue page -------------------------------------------------------------------------------------


@console_page
@require_GET
def issue_detail(request, ref):
    issue = _issue(request, ref)
    thread = issue_thread(issue=issue)
    live_run = next((run for run in thread["runs"] if run.is_live), None)
    events = run_log_tail(run=live_run, tail=LIVE_TAIL) if live_run else []
    context = {
        "company": issue.company,
        "issue": issue,
        **thread,
        "live_run": live_run, "events": events, "last_seq": events[-1].seq if events else 0,
        "poll_every": POLL_EVERY,
        "statuses": IssueStatus.choices,
        "priorities": IssuePriority.choices,
        "agents": assignable_agents(company=issue.company),
        "issue_panels": issue_panels(request, issue),  # e.g. the connector link panel (issues/console/panels.py)
        "attachments": attachment_list(issue=issue),
        "attachment_max_bytes": max_upload_bytes(),
    }
    return render_page(request, "console/issues/detail.html", None, context)


@console_action
def issue_change(request, ref):
    """Status, priority, assignee (and an optional comment) through ``issue_update``."""
    issue = _issue(request, ref)
    require_role(request, issue.company_id, ACT_ON_WORK)
    changes = {}
    for field, name, allowed in (("status", "status", IssueStatus.values),
                                 ("priority", "priority", IssuePriority.values)):
        value = request.POST.get(field)
        if value:
            if value not in allowed:
                messages.error(request, f"{field}: '{value}' is not one of {', '.join(allowed)}.")
                return HttpResponseRedirect(issue_url(issue))
            changes[name] = value
    if "assignee" in request.POST:
        changes["assignee_agent_id"] = request.POST["assignee"] or None
    comment = (request.POST.get("comment") or "").strip() or None
    return perform(
        request,
        lambda: issue_update(actor=console_actor(request), issue=issue, changes=changes, comment=comment),
        success="Issue updated.", redirect_to=issue_url(issue),
    )


@console_action
def issue_force_release_view(request, ref):
    """Clear a stranded checkout lock (``issue_force_release``), optionally unassigning the agent."""
    issue = _issue(request, ref)
    require_role(request, issue.company_id, ACT_ON_WORK)
    clear = request.POST.get("clear_assignee") == "on"
    return perform(
        request,
        lambda: issue_force_release(actor=console_actor(request), issue=issue, clear_assignee=clear),
        success="Lock released." + (" The agent is unassigned." if clear else ""), redirect_to=issue_url(issue),
    )


@console_action
def comment_add(request, ref):
    issue = _issue(request, ref)
    require_role(request, issue.company_id, ACT_ON_WORK)
    return perform(
        request,
        lambda: comment_create(actor=console_actor(request), issue=issue, body=request.POST.get("body", "")),
        success="Comment added.", redirect_to=issue_url(issue) + "#thread",
    )


@console_action
def interaction_answer(request, interaction_id):
    """Accept or reject a confirmation (answer or reject a question) through ``interaction_respond``."""
    actor = console_actor(request)
    interaction = scoped_get(Interaction.objects.select_related("issue"), actor, interaction_id, "Interaction")
    require_role(request, interaction.company_id, ACT_ON_WORK)
    status = request.POST.get("status", "")
    response = {}
    answer = (request.POST.get("answer") or "").strip()
    if answer:
        response["answer"] = answer
    verb = {InteractionStatus.ACCEPTED: "accepted", InteractionStatus.REJECTED: "rejected",
            InteractionStatus.ANSWERED: "answered", InteractionStatus.CANCELLED: "cancelled"}.get(status, status)
    return perform(
        request,
        lambda: interaction_respond(actor=actor, interaction=interaction, status=status, response=response),
        success=f"“{interaction.title}” {verb}.",
        redirect_to=issue_url(interaction.issue) + f"#interaction-{interaction.pk}",
    )


# --- attachments ------------------------------------------------------------------------------------------


@console_action
def attachment_upload(request, ref):
    """Attach one file (multipart field ``file``) through ``attachment_create``."""
    issue = _issue(request, ref)
    require_role(request, issue.company_id, ACT_ON_WORK)
    return perform(
        request,
        lambda: attachment_create(actor=console_actor(request), issue=issue,
                                  upload=one_uploaded_file(request, "file")),
        success="Attached “{result.original_filename}”.", redirect_to=issue_url(issue) + "#attachments",
    )


@console_action
def attachment_remove(request, attachment_id):
    """Delete an attachment and its bytes through ``attachment_delete`` (confirmed in the page first)."""
    actor = console_actor(request)
    attachment = attachment_get(actor=actor, pk=attachment_id)
    require_role(request, attachment.company_id, ACT_ON_WORK)
    return perform(
        request,
        lambda: attachment_delete(actor=actor, attachment=attachment),
        success="Deleted “{result.original_filename}”.", redirect_to=issue_url(attachment.issue) + "#attachments",
    )


# --- documents --------------------------------------------------------------------------------------------


def _revision_number(value, default):
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        raise Http404("No such revision.") from None


def revision_diff(old: str, new: str, n: int = 3) -> list[tuple[str, str]]:
    """``(kind, line)`` pairs of a unified diff (kind: hunk, add, del, ctx); the template escapes."""
    rows = []
    for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=n):
        if line.startswith(("---", "+++")):
            continue
        kind = {"@": "hunk", "+": "add", "-": "del"}.get(line[:1], "ctx")
        rows.append((kind, line))
    return rows


@console_page
@require_GET
def document_detail(request, ref, key):
    """A document's revisions, one revision's text and the diff between two revisions."""
    issue = _issue(request, ref)
    document = document_get(issue=issue, key=key)
    revisions = list(document_revisions(document=document))
    latest = revisions[0].number if revisions else 0
    shown_number = _revision_number(request.GET.get("rev"), latest)
    to_number = _revision_number(request.GET.get("to"), latest)
    from_number = _revision_number(request.GET.get("from"), max(to_number - 1, 0))
    by_number = {r.number: r for r in revisions}
    if revisions and (shown_number not in by_number or to_number not in by_number
                      or (from_number and from_number not in by_number)):
        raise Http404("No such revision.")
    shown = by_number.get(shown_number)
    old = by_number.get(from_number)
    new = by_number.get(to_number)
    diff = revision_diff(old.body if old else "", new.body if new else "") if new else []
    context = {
        "company": issue.company, "issue": issue, "document": document, "revisions": revisions,
        "shown": shown, "diff": diff, "from_number": from_number, "to_number": to_number,
    }
    return render_page(request, "console/issues/document.html", "console/issues/_diff.html", context)


@console_action
def document_remove(request, ref, key):
    """Delete a document with all its revisions through ``document_delete`` (confirmed in the page
    first); a refusal (an interaction bound to it) is flashed on the issue page like the success."""
    issue = _issue(request, ref)
    require_role(request, issue.company_id, ACT_ON_WORK)
    return perform(request, lambda: document_delete(actor=console_actor(request), issue=issue, key=key),
                   success=f"Deleted the document “{key.lower()}” and its revisions.",
                   redirect_to=issue_url(issue) + "#documents")
