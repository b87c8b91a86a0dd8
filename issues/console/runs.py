"""Run pages: one run with its liveness and a log tail that htmx polls until the run ends."""
from django.http import Http404
from django.views.decorators.http import require_GET

from issues.selectors import run_get, run_log_tail

from .base import adopt_company, render_page
from .permissions import console_actor, console_page

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
    run = _run(request, run_id)
    events = run_log_tail(run=run)
    context = {"company": run.company, "run": run, "events": events,
               "last_seq": events[-1].seq if events else 0, "poll_every": POLL_EVERY,
               "pr_link": _web_link(run.result_pr_url)}
    return render_page(request, "console/runs/detail.html", None, context)


def _web_link(url: str) -> str | None:
    """Only an http(s) URL becomes a link (never javascript: or data:, whatever got stored)."""
    return url if url and url.lower().startswith(("http://", "https://")) else None


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
