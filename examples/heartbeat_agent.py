#!/usr/bin/env python3
"""A small agent that follows the Paperclip Heartbeat Protocol (standard library only).

Started by the process adapter with PAPERCLIP_API_URL, PAPERCLIP_API_KEY, PAPERCLIP_RUN_ID,
PAPERCLIP_AGENT_ID, PAPERCLIP_COMPANY_ID and, depending on the wake, PAPERCLIP_TASK_ID,
PAPERCLIP_WAKE_REASON, PAPERCLIP_WAKE_COMMENT_ID(S), PAPERCLIP_APPROVAL_ID,
PAPERCLIP_APPROVAL_STATUS, PAPERCLIP_LINKED_ISSUE_IDS and PAPERCLIP_TASK_PACKET_PATH.

One heartbeat: identity -> approval follow-up -> inbox -> pick -> checkout (a 409 moves on to the
next task; the refused one is never retried) -> read the task packet, the issue and its thread ->
work -> comment -> status. The last stdout line is the worker's output contract::

    PAPERCLIP_RESULT {"status": "done|handoff|failed|aborted", "liveness": ..., "reason": ...,
                      "summary": ..., "pr_url": ..., "final_state": ...}

Options (environment):
  EXAMPLE_AGENT_MODE        done (default) | review (ends in in_review, status handoff) | plan_only
                            | delegate | approval | fail | report_failure | sleep
                            plan_only:      write a "plan" document, comment, exit without finishing
                            delegate:       give the work to a child task (assignee
                                            EXAMPLE_AGENT_DELEGATE_TO, blockParentUntilDone) and exit;
                                            woken when the child is done, finish the parent
                                            (naming the assignee needs tasks:assign: the agent's
                                            canAssignTasks grant, canCreateAgents or the CEO role;
                                            without it the issue is blocked with a comment saying so)
                            approval:       ask the board (request_board_approval) and exit; woken
                                            with PAPERCLIP_APPROVAL_ID, finish (approved) or explain
                                            (rejected / revision requested)
                            fail:           print an error and exit 2 before doing anything
                            report_failure: report status "failed" (the host retries with backoff)
                            sleep:          sleep EXAMPLE_AGENT_SLEEP seconds, one line per second
  EXAMPLE_AGENT_SLEEP       seconds for sleep mode (default 30)
  EXAMPLE_AGENT_DELEGATE_TO agent id for delegate mode
  EXAMPLE_AGENT_PR_URL      a pull request URL to report with the result
  EXAMPLE_AGENT_WRITE_FILE  1: write NOTES.md in the working directory (the workspace)
  EXAMPLE_AGENT_ECHO_KEY    1: print the API key (to test that the host redacts it)
"""
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

API = os.environ.get("PAPERCLIP_API_URL", "http://127.0.0.1:8000/api").rstrip("/")
if not API.endswith("/api"):  # upstream hands out the origin; the host here may include /api
    API += "/api"
KEY = os.environ.get("PAPERCLIP_API_KEY", "")
RUN_ID = os.environ.get("PAPERCLIP_RUN_ID", "")
TASK_ID = os.environ.get("PAPERCLIP_TASK_ID", "")
APPROVAL_ID = os.environ.get("PAPERCLIP_APPROVAL_ID", "")
APPROVAL_STATUS = os.environ.get("PAPERCLIP_APPROVAL_STATUS", "")
WAKE_REASON = os.environ.get("PAPERCLIP_WAKE_REASON", "")
WAKE_COMMENT_IDS = [c for c in os.environ.get("PAPERCLIP_WAKE_COMMENT_IDS", "").split(",") if c]
if os.environ.get("PAPERCLIP_WAKE_COMMENT_ID"):
    WAKE_COMMENT_IDS.append(os.environ["PAPERCLIP_WAKE_COMMENT_ID"])
PACKET_PATH = os.environ.get("PAPERCLIP_TASK_PACKET_PATH", "")
MODE = os.environ.get("EXAMPLE_AGENT_MODE", "done")
PR_URL = os.environ.get("EXAMPLE_AGENT_PR_URL", "")
CHECKOUT_FROM = ["todo", "backlog", "blocked", "in_review"]
COMMENT_WAKES = ("issue_commented", "issue_comment_mentioned", "comment")
TERMINAL = ("done", "cancelled")


class ApiError(Exception):
    def __init__(self, method, path, status, body):
        super().__init__(f"{method} {path} -> HTTP {status}: {body[:300]}")
        self.status = status
        self.code = ""
        try:
            data = json.loads(body)
        except ValueError:
            return
        error = data.get("error") if isinstance(data, dict) else None
        # Upstream's shape is {"error": "<message>", "code": ...}; older hosts nest {"error": {"code"}}.
        if isinstance(error, dict):
            self.code = error.get("code") or ""
        elif isinstance(data, dict):
            self.code = data.get("code") or ""


def log(message):
    print(message, flush=True)


def finish(liveness, reason, code=0, status=None, summary=None):
    result = {"liveness": liveness, "reason": reason}
    if status:
        result["status"] = status
        result["summary"] = summary or reason
        if PR_URL and status in ("done", "handoff"):
            result["pr_url"] = PR_URL
    print("PAPERCLIP_RESULT " + json.dumps(result), flush=True)
    sys.exit(code)


def api(method, path, body=None, params=None):
    url = API + path
    if params:
        url += "?" + urllib.parse.urlencode(params)
    # The run header goes on every request: mutations require it, and every call counts as liveness.
    headers = {"Authorization": f"Bearer {KEY}", "Accept": "application/json", "X-Paperclip-Run-Id": RUN_ID}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        raise ApiError(method, path, exc.code, exc.read().decode("utf-8", "replace")) from None
    return json.loads(raw) if raw else None


def candidates(inbox, me_id):
    """Step 4's order: PAPERCLIP_TASK_ID when it is mine, in_progress, in_review only when a comment
    on it woke me (someone asked for a review), then todo. Blocked work is skipped."""
    mine = [i for i in inbox if i.get("assigneeAgentId") == me_id]
    review_asked = WAKE_REASON in COMMENT_WAKES
    workable = ("todo", "in_progress", "in_review") if review_asked else ("todo", "in_progress")
    ordered = [i for i in mine if TASK_ID and i["id"] == TASK_ID and i["status"] in workable]
    ordered += [i for i in mine if i["status"] == "in_progress"]
    if review_asked:
        ordered += [i for i in mine if i["status"] == "in_review" and i["id"] == TASK_ID]
    ordered += [i for i in mine if i["status"] == "todo"]
    seen, unique = set(), []
    for issue in ordered:
        if issue["id"] not in seen:
            seen.add(issue["id"])
            unique.append(issue)
    return unique


def checkout_first(options, me_id):
    """Check out the first task that is free. A 409 means another owner: move to the next, never retry."""
    for issue in options:
        log(f"picked {issue['identifier']} ({issue['status']}): {issue['title']}")
        try:
            api("POST", f"/issues/{issue['id']}/checkout", {"agentId": me_id, "expectedStatuses": CHECKOUT_FROM})
        except ApiError as exc:
            if exc.status == 409:
                log(f"checkout of {issue['identifier']} refused (409 {exc.code or 'conflict'}); next task")
                continue
            raise
        log(f"checked out {issue['identifier']} ({issue['status']})")
        return issue
    return None


def read_packet():
    if not PACKET_PATH:
        return ""
    try:
        with open(PACKET_PATH, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        log(f"task packet {PACKET_PATH} unreadable: {exc}")
        return ""
    first = next((line for line in text.splitlines() if line.strip()), "")
    log(f"task packet: {len(text)} chars; {first[:120]}")
    return text


def write_notes(issue, comments, packet):
    lines = [f"# {issue['identifier']}: {issue['title']}", "", issue.get("description") or "(no description)", ""]
    if comments:
        lines += ["## Thread", ""] + [f"- {c.get('body', '')[:200]}" for c in comments] + [""]
    if packet:
        lines += ["## Task packet", "", packet[:2000], ""]
    lines += [f"Run {RUN_ID}: read the task and its thread, finished it.", ""]
    with open("NOTES.md", "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines))
    return os.path.abspath("NOTES.md")


def follow_up_approval(me_id):
    """Step 2: an approval I asked for was decided. Approved: finish its linked issues. Otherwise
    explain on each why it stays open."""
    approval = api("GET", f"/approvals/{APPROVAL_ID}")
    linked = api("GET", f"/approvals/{APPROVAL_ID}/issues")
    status = approval.get("status") or APPROVAL_STATUS
    note = approval.get("decisionNote") or ""
    log(f"approval {APPROVAL_ID} is {status}; linked issues: " + (", ".join(i["identifier"] for i in linked) or "none"))
    finished = []
    for issue in linked:
        if issue["status"] in TERMINAL:
            continue
        if status == "approved":
            if checkout_first([issue], me_id) is None:
                continue
            api("PATCH", f"/issues/{issue['id']}",
                {"status": "done", "comment": f"The board approved ({note or 'no note'}); done in run {RUN_ID}."})
            finished.append(issue["identifier"])
        else:
            api("POST", f"/issues/{issue['id']}/comments",
                {"body": f"The board answered {status} ({note or 'no note'}); this stays open until it is revised."})
    return status, finished


def delegate(issue, detail, me_id, company_id):
    """Give the work to a child task that blocks this one; Paperclip wakes me when it is done."""
    children = api("GET", f"/companies/{company_id}/issues", params={"parentId": issue["id"]})
    if children and all(c["status"] in TERMINAL for c in children):
        return [c["identifier"] for c in children]
    if children:
        return None  # still waiting (a wake came early): leave it to the next wake
    assignee = os.environ.get("EXAMPLE_AGENT_DELEGATE_TO") or me_id
    try:
        child = api("POST", f"/companies/{company_id}/issues", {
            "title": f"Part of {detail['identifier']}: {detail['title']}",
            "description": "Delegated by the example agent.", "parentId": issue["id"], "goalId": detail.get("goalId"),
            "assigneeAgentId": assignee, "blockParentUntilDone": True,
        })
    except ApiError as exc:
        if exc.status != 403:
            raise
        # No tasks:assign: say so where the board looks, once, and stop (retrying cannot help).
        api("PATCH", f"/issues/{issue['id']}", {"status": "blocked", "comment": (
            "I cannot delegate this: my agent may not assign tasks (tasks:assign). Next action for the board: "
            "grant it on my agent page (May assign tasks), or assign the work yourselves.")})
        log(f"cannot delegate {detail['identifier']}: {exc}")
        finish("blocked", "no tasks:assign to delegate")
    api("POST", f"/issues/{issue['id']}/comments",
        {"body": f"Delegated to {child['identifier']}; this issue is blocked until it is done. Next action: "
                 "finish this issue when Paperclip wakes me."})
    log(f"delegated {detail['identifier']} to {child['identifier']}")
    finish("blocked", f"waiting for {child['identifier']}")


def ask_approval(issue, detail, company_id):
    approval = api("POST", f"/companies/{company_id}/approvals", {
        "type": "request_board_approval", "issueIds": [issue["id"]],
        "payload": {"title": f"Go ahead with {detail['identifier']}?", "summary": detail["title"],
                    "recommendedAction": "approve", "risks": []},
    })
    api("POST", f"/issues/{issue['id']}/comments",
        {"body": f"Asked the board for approval {approval['id']}; waiting. Next action: finish on approval."})
    log(f"requested approval {approval['id']}")
    finish("blocked", f"waiting for approval {approval['id']}")


def heartbeat():
    if os.environ.get("EXAMPLE_AGENT_ECHO_KEY") == "1":
        log(f"debug: my api key is {KEY}")
        print(f"debug (stderr): key={KEY}", file=sys.stderr, flush=True)
    if MODE == "fail":
        print("simulated failure (EXAMPLE_AGENT_MODE=fail)", file=sys.stderr, flush=True)
        sys.exit(2)
    if MODE == "report_failure":
        finish("failed", "simulated failure", code=1, status="failed", summary="Simulated failure; retry me.")
    if MODE == "sleep":
        seconds = int(os.environ.get("EXAMPLE_AGENT_SLEEP", "30"))
        for n in range(seconds):
            log(f"working... {n + 1}/{seconds}")
            time.sleep(1)
        finish("advanced", f"slept {seconds}s")

    if not KEY or not RUN_ID:
        print("PAPERCLIP_API_KEY and PAPERCLIP_RUN_ID must be set", file=sys.stderr, flush=True)
        finish("failed", "missing PAPERCLIP_API_KEY or PAPERCLIP_RUN_ID", code=1)

    # Step 1: identity.
    me = api("GET", "/agents/me")
    me_id, company_id = me["id"], me["companyId"]
    log(f"agent {me['name']} ({me_id}) of company {company_id}; run {RUN_ID}; wake reason: {WAKE_REASON or '-'}")

    # Step 2: approval follow-up.
    if APPROVAL_ID:
        status, finished = follow_up_approval(me_id)
        if MODE == "approval":
            if finished:
                finish("completed", f"approval {status}: finished {', '.join(finished)}", status="done")
            finish("blocked", f"approval {status}; linked issues stay open")

    # Step 3: the inbox.
    inbox = api("GET", f"/companies/{company_id}/issues",
                params={"assigneeAgentId": me_id, "status": "todo,in_progress,in_review,blocked"})
    log(f"inbox: {len(inbox)} issue(s)")

    # Steps 4-5: pick and check out; a 409 moves on to the next task.
    options = candidates(inbox, me_id)
    if not options:
        log("nothing to do")
        finish("empty_response", "no actionable issue assigned")
    issue = checkout_first(options, me_id)
    if issue is None:
        finish("blocked", "every actionable task is owned by another run")
    review = issue["status"] == "in_review"

    # Step 6: context.
    packet = read_packet()
    context = api("GET", f"/issues/{issue['id']}/heartbeat-context")  # the skill's compact payload
    detail = {**context["issue"], "ancestors": context["ancestors"]}
    # the thread in order, read only when the cursor says there is one
    comments = (api("GET", f"/issues/{issue['id']}/comments", params={"order": "asc"})
                if context["commentCursor"]["totalComments"] else [])
    ancestors = " > ".join(a["identifier"] for a in detail.get("ancestors") or []) or "none"
    log(f"read {detail['identifier']}: {len(comments)} comment(s); ancestors: {ancestors}")
    triggers = [c for c in comments if c["id"] in WAKE_COMMENT_IDS]
    if triggers:
        log(f"woken by comment: {triggers[-1]['body'][:120]}")

    # Step 7: the work.
    if MODE == "plan_only":
        plan = f"# Plan for {detail['identifier']}\n\n1. Understand: {detail['title']}\n2. Do it\n3. Verify\n"
        api("PUT", f"/issues/{issue['id']}/documents/plan", {"title": "Plan", "body": plan})
        api("POST", f"/issues/{issue['id']}/comments",
            {"body": "Wrote a plan (document `plan`). Next action: implement step 1 in the next heartbeat."})
        log("wrote the plan; not finishing the issue")
        finish("plan_only", "plan written; implementation pending")
    done = [f"Read {detail['identifier']} and its {len(comments)} comment(s)."]
    if MODE == "delegate" and not review:
        children = delegate(issue, detail, me_id, company_id)
        if children is None:
            finish("blocked", "the child task is still open")
        done.append(f"Its child task(s) {', '.join(children)} are done.")
    if MODE == "approval" and not review:
        ask_approval(issue, detail, company_id)
    if review:
        done.append("Reviewed it as asked" + (f": {triggers[-1]['body'][:120]}" if triggers else "."))
    if os.environ.get("EXAMPLE_AGENT_WRITE_FILE") == "1":
        path = write_notes(detail, comments, packet)
        done.append(f"Wrote {os.path.basename(path)} in the workspace.")
        log(f"wrote {path}")
    api("POST", f"/issues/{issue['id']}/comments", {"body": "Example agent: " + " ".join(done)})
    log("commented")

    # Step 8: status.
    if MODE == "review" and not review:
        api("PATCH", f"/issues/{issue['id']}",
            {"status": "in_review", "comment": f"Ready for review (example agent, run {RUN_ID})."})
        log(f"{detail['identifier']} is in review")
        finish("completed", f"{detail['identifier']} handed to review", status="handoff",
               summary=" ".join(done))
    api("PATCH", f"/issues/{issue['id']}",
        {"status": "done", "comment": f"Done by the example agent in run {RUN_ID}."})
    log(f"{detail['identifier']} is done")
    finish("completed", f"finished {detail['identifier']}", status="done", summary=" ".join(done))


def main():
    try:
        heartbeat()
    except ApiError as exc:
        print(f"API error: {exc}", file=sys.stderr, flush=True)
        finish("failed", str(exc)[:200], code=1)
    except (urllib.error.URLError, OSError) as exc:
        print(f"cannot reach {API}: {exc}", file=sys.stderr, flush=True)
        finish("failed", f"API unreachable: {exc}"[:200], code=1)


if __name__ == "__main__":
    main()
