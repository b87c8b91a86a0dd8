"""``postTranscripts`` (§10.2, default off; it SHOULD stay off: transcripts may hold sensitive context).

When a run of a linked issue finishes and the link's toggle is on, one comment per run (outbox source
id ``transcript:<runId>``) carries a summary of the run: status and liveness, duration, tokens, the
agent's reported summary and PR, and the tail of its log. It goes through the outbound engine like
every mirrored comment (agent attribution, issue link, hidden marker; the toggle is checked again at
delivery). The text is bounded (``CONNECTORS["TRANSCRIPT_MAX_CHARS"]``, default 4,000: the oldest log
lines give way first, with a note saying so) and redacted: the agent's configured secrets (the same
values the host keeps out of the run log, ``issues.adapters.redact``) and anything shaped like a
credential (provider tokens, bearer/basic headers, JWTs, private keys, ``NAME_TOKEN=...`` pairs,
passwords in URLs)."""
from __future__ import annotations

import re

from connectors.choices import LinkStatus, OutboundKind
from connectors.models import TaskLink
from issues.adapters import get_adapter, redact
from issues.choices import RunEventKind
from issues.models import RunEvent

from .common import conf
from .outbound import effect_record, write_refusal

TOGGLE = "postTranscripts"
MILESTONE = "transcript"
LOG_KINDS = (RunEventKind.STDOUT, RunEventKind.STDERR, RunEventKind.SYSTEM)
TAIL_EVENTS = 500  # log events read at most (the tail survives the bound anyway)
REDACTED = "[redacted]"
# Credential shapes redacted wherever they appear (the value only, so the line still reads).
TOKEN_PATTERNS = (
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.S),
    re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}"
               r"|xox[abprs]-[A-Za-z0-9-]{10,}|sk-[A-Za-z0-9_-]{16,}|lin_(?:api|oauth)_[A-Za-z0-9]{16,}"
               r"|pcp_[A-Za-z0-9_-]{16,}|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{35})"),
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),  # a JWT
)
# (prefix kept, value redacted)
KEYED_PATTERNS = (
    re.compile(r"(?i)(\b(?:bearer|basic|token)\s+)[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"(\b[A-Z][A-Z0-9_]*(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?|AUTH)[A-Z0-9_]*\s*[=:]\s*[\"']?)"
               r"[^\s\"',;]{4,}"),
    re.compile(r"(?i)(\b(?:password|passwd|secret|api[_-]?key|access[_-]?token)[\"']?\s*[=:]\s*[\"']?)[^\s\"',;]{4,}"),
    re.compile(r"(https?://)[^/\s:@]+:[^/\s@]+(?=@)"),  # a password in a URL
)


def run_transcript_posted(*, run):
    """Record the transcript comment of a finished run on every linked issue link whose toggle is on
    (inside the run's finishing transaction: the outbox row commits with it)."""
    if run.issue_id is None:
        return
    links = [link for link in TaskLink.objects.select_related("instance").filter(issue_id=run.issue_id)
             .exclude(status=LinkStatus.UNLINKED) if not write_refusal(link, OutboundKind.COMMENT, toggle=TOGGLE)]
    if not links:
        return
    text = transcript_text(run)
    for link in links:
        effect_record(link=link, kind=OutboundKind.COMMENT, source_id=f"transcript:{run.pk}", milestone=MILESTONE,
                      payload={"lines": [text], "agent": run.agent.name, "issueId": str(run.issue_id),
                               "runId": str(run.pk)})


def transcript_text(run) -> str:
    """The bounded, redacted summary of ``run``."""
    limit = max(int(conf("TRANSCRIPT_MAX_CHARS")), 500)
    secrets = _agent_secrets(run.agent)
    head = redact_text("\n".join(_summary_lines(run)), secrets)
    events = list(RunEvent.objects.filter(run=run, kind__in=LOG_KINDS).order_by("-seq")
                  .values_list("kind", "message")[:TAIL_EVENTS])
    lines = [f"[{kind}] {message}" if kind != RunEventKind.STDOUT else message
             for kind, message in reversed(events) if message]
    log = redact_text("\n".join(lines).strip(), secrets)
    if len(head) > limit // 2:
        head = head[:limit // 2 - 1] + "…"
    if not log:
        return head
    fence = "`" * max(3, _longest_backtick_run(log) + 1)
    frame = len(head) + len("\n\nLog (last lines):\n") + 2 * len(fence) + 2
    room = limit - frame
    if len(log) > room:
        note = "… {} earlier characters omitted (the full log is on the run in Paperclip)\n"
        room -= len(note.format(len(log)))
        omitted = len(log) - max(room, 0)
        tail = log[omitted:]
        cut = tail.find("\n")
        if 0 <= cut < len(tail) - 1:  # start at a line boundary
            omitted, tail = omitted + cut + 1, tail[cut + 1:]
        log = note.format(omitted) + tail
    return f"{head}\n\nLog (last lines):\n{fence}\n{log}\n{fence}"


def redact_text(text: str, secrets=()) -> str:
    text = redact(text, secrets)
    for pattern in TOKEN_PATTERNS:
        text = pattern.sub(REDACTED, text)
    for pattern in KEYED_PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
    return text


def _summary_lines(run) -> list[str]:
    status = run.status.replace("_", " ")
    lines = [f"Run transcript: run {str(run.pk)[:8]} {status}"
             + (f" ({run.liveness}: {run.liveness_reason})" if run.liveness else "")]
    facts = []
    if run.started_at and run.finished_at:
        seconds = int((run.finished_at - run.started_at).total_seconds())
        facts.append(f"duration {seconds // 60}m {seconds % 60:02d}s")
    if run.input_tokens or run.output_tokens:
        facts.append(f"tokens {run.input_tokens:,} in / {run.output_tokens:,} out")
    if facts:
        lines.append(" · ".join(facts))
    if run.result_summary:
        lines.append(f"Summary: {run.result_summary.strip()}")
    if run.result_pr_url:
        lines.append(f"PR: {run.result_pr_url}")
    if run.error:
        lines.append(f"Error: {run.error.strip().splitlines()[0][:500]}")
    return lines


def _agent_secrets(agent) -> list[str]:
    """The values the host redacts from this agent's run log (its adapter's configured secrets)."""
    try:
        return [s for s in get_adapter(agent.adapter_type).secrets_from_config(agent.adapter_config or {},
                                                                               company_id=agent.company_id) if s]
    except Exception:  # noqa: BLE001 — an unusable config has no secrets to resolve; patterns still apply
        return []


def _longest_backtick_run(text: str) -> int:
    return max((len(m.group(0)) for m in re.finditer(r"`+", text)), default=0)
