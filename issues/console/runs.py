"""Run pages: one run with its liveness and a log tail that htmx polls until the run ends; for a
PRP run also its live session snapshot (polled the same way), the goal controls the runner
advertises and the answer form of a runner's runtime request on the issue page."""
from django.http import Http404, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_GET

from issues.choices import InteractionKind
from issues.models import Interaction
from issues.runner.goals import goal_action
from issues.runner.selectors import runner_fingerprint, runner_run_view
from issues.selectors import run_get, run_log_tail, run_with_pending_wakes, scoped_get
from issues.services.thread import interaction_respond
from paperclip.core.links import web_url

from .base import adopt_company, perform, render_page
from .permissions import ACT_ON_WORK, console_action, console_actor, console_page, require_role

# htmx stops polling an element whose request is answered with this status.
STOP_POLLING = 286
POLL_EVERY = "2s"


def _run(request, run_id):
    run = run_get(actor=console_actor(request), pk=run_id)
    adopt_company(request, run.company)
    return run


@console_page
@require_GET
def run_detail(request, run_id):
    run = run_with_pending_wakes(_run(request, run_id))
    events = run_log_tail(run=run)
    context = {"company": run.company, "run": run, "events": events,
               "last_seq": events[-1].seq if events else 0, "poll_every": POLL_EVERY,
               "pr_link": web_url(run.result_pr_url), "runner": runner_run_view(run)}
    return render_page(request, "console/runs/detail.html", None, context)


@console_page
@require_GET
def run_runner(request, run_id):
    """The PRP session panel alone, for htmx polling: 204 while nothing changed, final (286) once
    the run has ended."""
    run = _run(request, run_id)
    fingerprint = runner_fingerprint(run)
    if fingerprint is None:
        raise Http404("This run has no runner session.")
    if run.is_live and request.GET.get("fp") == fingerprint:
        return HttpResponse(status=204)  # nothing changed: htmx keeps the panel and polls on
    runner = runner_run_view(run)
    context = {"company": run.company, "run": run, "runner": runner, "poll_every": POLL_EVERY}
    return render_page(request, "console/runs/_runner_session.html", "console/runs/_runner_session.html", context,
                       status=STOP_POLLING if not run.is_live else 200)


@console_action
def run_goal(request, run_id):
    """Set, pause, resume or clear the runner's session goal (only what the runner advertises)."""
    run = _run(request, run_id)
    require_role(request, run.company_id, ACT_ON_WORK)
    action = request.POST.get("action", "")
    return perform(
        request,
        lambda: goal_action(actor=console_actor(request), run=run, action=action,
                            objective=request.POST.get("objective"), token_budget=request.POST.get("tokenBudget")),
        success=f"Goal {action} sent to the runner.",
        redirect_to=reverse("console:run-detail", args=[run.pk]) + "#runner-goal")


@console_action
def runtime_request_answer(request, interaction_id):
    """Answer a runner's runtime request: Allow / Deny a permission; answer (one field per
    question of a question set, ``q:<id>``, ``q:<id>:custom``) or reject a question."""
    actor = console_actor(request)
    interaction = scoped_get(Interaction.objects.select_related("issue").filter(kind=InteractionKind.RUNTIME_REQUEST),
                             actor, interaction_id, "Interaction")
    require_role(request, interaction.company_id, ACT_ON_WORK)
    status = request.POST.get("status", "")
    permission = interaction.payload.get("type") == "permission"
    verb = {"accepted": "allowed" if permission else "accepted", "rejected": "denied" if permission else "rejected",
            "answered": "answered", "cancelled": "cancelled"}.get(status, status)
    response = {}
    if (answer := (request.POST.get("answer") or "").strip()):
        response["answer"] = answer
    if (choice := request.POST.get("choice")):
        response["choice"] = choice
    questions = ((interaction.payload.get("request") or {}).get("input") or {}).get("questions") or []
    if questions and status == "answered":
        response["answers"] = {q["id"]: [v for v in request.POST.getlist(f"q:{q['id']}") + [
            request.POST.get(f"q:{q['id']}:custom", "")] if v.strip()] for q in questions}
    return perform(
        request,
        lambda: interaction_respond(actor=actor, interaction=interaction, status=status, response=response),
        success=f"“{interaction.title}” {verb}.",
        redirect_to=reverse("console:issue-detail", args=[interaction.issue.identifier]) + f"#interaction-{interaction.pk}")


@console_page
@require_GET
def run_log(request, run_id):
    """The log lines after ``after``; while the run is live the answer carries the next poller,
    once it ended the answer is final and says so with status 286 (htmx stops polling)."""
    run = _run(request, run_id)
    try:
        after = int(request.GET.get("after", "0"))
    except ValueError:
        raise Http404("Bad cursor.") from None
    events = run_log_tail(run=run, after=after)
    context = {"run": run, "events": events, "last_seq": events[-1].seq if events else after,
               "poll_every": POLL_EVERY, "final": not run.is_live}
    return render_page(request, "console/runs/_log_chunk.html", "console/runs/_log_chunk.html", context,
                       status=STOP_POLLING if not run.is_live else 200)


RUN_LIST_LIMIT = 100


@console_page
@require_GET
def run_list(request):
    """The company's latest runs; ``?live=1`` keeps only queued, retrying and running ones."""
    from issues.choices import LIVE_RUN_STATUSES
    from issues.models import HeartbeatRun

    company = request.company
    live_only = request.GET.get("live") == "1"
    runs = []
    if company is not None:
        qs = HeartbeatRun.objects.filter(company=company).select_related("agent", "issue").order_by("-created_at")
        if live_only:
            qs = qs.filter(status__in=LIVE_RUN_STATUSES)
        runs = list(qs[:RUN_LIST_LIMIT])
    return render_page(request, "console/runs/list.html", "console/runs/_rows.html",
                       {"company": company, "runs": runs, "live_only": live_only, "limit": RUN_LIST_LIMIT})
