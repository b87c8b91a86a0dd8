#!/usr/bin/env python3
"""A small agent that follows the Paperclip Heartbeat Protocol (standard library only).

Started by the process adapter with PAPERCLIP_API_URL, PAPERCLIP_API_KEY, PAPERCLIP_RUN_ID,
PAPERCLIP_AGENT_ID, PAPERCLIP_COMPANY_ID and optionally PAPERCLIP_TASK_ID,
PAPERCLIP_APPROVAL_ID, PAPERCLIP_WAKE_REASON and PAPERCLIP_WAKE_COMMENT_IDS in its environment.

One heartbeat: identity -> approval follow-up -> inbox -> pick -> checkout (a 409 ends the
heartbeat; it is never retried) -> read the issue and its thread -> work -> comment -> done.
The last stdout line reports liveness: ``PAPERCLIP_RESULT {"liveness": ..., "reason": ...}``.

Options (environment):
  EXAMPLE_AGENT_MODE        done (default) | review (ends in in_review) | plan_only | fail | sleep
                            plan_only: write a "plan" document, comment, exit without finishing
                            fail:      print an error and exit 2 before doing anything
                            sleep:     sleep EXAMPLE_AGENT_SLEEP seconds, one line per second
  EXAMPLE_AGENT_SLEEP       seconds for sleep mode (default 30)
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
KEY = os.environ.get("PAPERCLIP_API_KEY", "")
RUN_ID = os.environ.get("PAPERCLIP_RUN_ID", "")
TASK_ID = os.environ.get("PAPERCLIP_TASK_ID", "")
APPROVAL_ID = os.environ.get("PAPERCLIP_APPROVAL_ID", "")
WAKE_REASON = os.environ.get("PAPERCLIP_WAKE_REASON", "")
WAKE_COMMENT_IDS = [c for c in os.environ.get("PAPERCLIP_WAKE_COMMENT_IDS", "").split(",") if c]
MODE = os.environ.get("EXAMPLE_AGENT_MODE", "done")
CHECKOUT_FROM = ["todo", "backlog", "blocked", "in_review"]


class ApiError(Exception):
    def __init__(self, method, path, status, body):
        super().__init__(f"{method} {path} -> HTTP {status}: {body[:300]}")
        self.status = status
        try:  # the host's one error shape: {"error": {"code", "message", "details"}}
            self.code = json.loads(body)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            self.code = ""


def log(message):
    print(message, flush=True)


def finish(liveness, reason, code=0):
    print("PAPERCLIP_RESULT " + json.dumps({"liveness": liveness, "reason": reason}), flush=True)
    sys.exit(code)


def api(method, path, body=None, params=None):
    url = API + path
    if params:
        url += "?" + urllib.parse.urlencode(params)
    # The run header goes on every request: mutations require it, reads ignore it.
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


def pick(inbox, me_id):
    """PAPERCLIP_TASK_ID if it is assigned to me; else in_progress first, then todo (inbox is by priority)."""
    mine = [i for i in inbox if i.get("assigneeAgentId") == me_id]
    if TASK_ID:
        for issue in mine:
            if issue["id"] == TASK_ID:
                return issue
    for status in ("in_progress", "todo"):
        for issue in mine:
            if issue["status"] == status:
                return issue
    return None


def write_notes(issue, comments):
    lines = [f"# {issue['identifier']}: {issue['title']}", "", issue.get("description") or "(no description)", ""]
    if comments:
        lines += ["## Thread", ""] + [f"- {c.get('body', '')[:200]}" for c in comments] + [""]
    lines += [f"Run {RUN_ID}: read the task and its thread, finished it.", ""]
    with open("NOTES.md", "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines))
    return os.path.abspath("NOTES.md")


def heartbeat():
    if os.environ.get("EXAMPLE_AGENT_ECHO_KEY") == "1":
        log(f"debug: my api key is {KEY}")
        print(f"debug (stderr): key={KEY}", file=sys.stderr, flush=True)
    if MODE == "fail":
        print("simulated failure (EXAMPLE_AGENT_MODE=fail)", file=sys.stderr, flush=True)
        sys.exit(2)
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
        approval = api("GET", f"/approvals/{APPROVAL_ID}")
        linked = api("GET", f"/approvals/{APPROVAL_ID}/issues")
        log(f"approval {APPROVAL_ID} is {approval.get('status')}; linked issues: "
            + (", ".join(i["identifier"] for i in linked) or "none"))

    # Step 3: the inbox.
    inbox = api("GET", f"/companies/{company_id}/issues",
                params={"assigneeAgentId": me_id, "status": "todo,in_progress,in_review,blocked"})
    log(f"inbox: {len(inbox)} issue(s)")

    # Step 4: pick.
    issue = pick(inbox, me_id)
    if issue is None:
        log("nothing to do")
        finish("empty_response", "no actionable issue assigned")
    log(f"picked {issue['identifier']} ({issue['status']}): {issue['title']}")

    # Step 5: checkout. A 409 means someone else owns it: stop, never retry, pick nothing else.
    try:
        api("POST", f"/issues/{issue['id']}/checkout", {"agentId": me_id, "expectedStatuses": CHECKOUT_FROM})
    except ApiError as exc:
        if exc.status == 409:
            # The code says what refused it: checkout_conflict (another run holds it),
            # assigned_elsewhere, status_not_expected.
            log(f"checkout of {issue['identifier']} refused (409): {exc.code or 'conflict'}; stopping")
            finish("blocked", f"checkout of {issue['identifier']} refused: {exc.code or 'conflict'}")
        raise
    log(f"checked out {issue['identifier']}")

    # Step 6: context.
    detail = api("GET", f"/issues/{issue['id']}")
    comments = api("GET", f"/issues/{issue['id']}/comments")
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
    if os.environ.get("EXAMPLE_AGENT_WRITE_FILE") == "1":
        path = write_notes(detail, comments)
        done.append(f"Wrote {os.path.basename(path)} in the workspace.")
        log(f"wrote {path}")
    api("POST", f"/issues/{issue['id']}/comments", {"body": "Example agent: " + " ".join(done)})
    log("commented")

    # Step 8: status.
    if MODE == "review":
        api("PATCH", f"/issues/{issue['id']}",
            {"status": "in_review", "comment": f"Ready for review (example agent, run {RUN_ID})."})
        log(f"{detail['identifier']} is in review")
        finish("completed", f"{detail['identifier']} handed to review")
    api("PATCH", f"/issues/{issue['id']}",
        {"status": "done", "comment": f"Done by the example agent in run {RUN_ID}."})
    log(f"{detail['identifier']} is done")
    finish("completed", f"finished {detail['identifier']}")


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
