"""The outbound write engine (§10, layer 4).

Effects are rows of the outbox (``OutboundEffect``), recorded inside the transaction of the
Paperclip change that caused them (connectors.receivers subscribes to the issues app's in-transaction
signals) and keyed ``(link, kind, source id)``, so a change can never produce the same write twice.
Workers drain them (``connectors.tasks.deliver_outbound`` after commit, the sweep as the safety
net) through the adapter's optional write methods, in order per link, retrying over hours before an
effect is parked for the operator (``outbound_queue``: order, backoff horizon, parking). Every write is
checked against the link's sync mode, field policy and write toggles (§10.2 defaults) both when it
is recorded and when it is delivered; every mirrored comment carries agent attribution, the issue
link and a stable hidden marker ``<!-- paperclip:effect:<id> -->`` (§10.4).

Nothing in the issues or cases apps calls a provider: they only send signals."""
from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from connectors.choices import (
    InstanceStatus,
    LinkStatus,
    OutboundKind,
    OutboundStatus,
    StateCategory,
)
from connectors.models import ConnectorInstance, OutboundEffect, TaskLink, default_write_policy
from connectors.providers.base import ExternalState, ExternalTask, ExternalTaskRef, TaskSourceAdapter
from issues.actors import SYSTEM
from issues.choices import IssueStatus
from issues.models import Agent
from issues.services.activity import activity_record

from . import content, logctx
from . import outbound_queue as outbox
from .common import adapter_class, adapter_for, conf
from .credential_health import credentials_ok


WRITE_SYNC_MODES = ("bidirectional", "export_only")
MILESTONE_DEBOUNCE = timedelta(minutes=5)  # §10.2: per link, except claim/done/review
# "pr": an opened pull request is the review request of the Symphony handoff (§10.3), so it is not held;
# "transcript": one comment per run (services/transcripts.py), never batched with another run's.
MAX_BATCHED_LINES = 10  # lines one debounced comment carries; more start another comment
UNDEBOUNCED_MILESTONES = ("claim", "done", "review", "failure", "state", "pr", "release", "transcript")
RECENT_OUTBOUND = timedelta(days=7)  # echo suppression window for outbound keys
MARKER = "<!-- paperclip:effect:{id} -->"

# Paperclip status -> the external state category it projects to (§10.3); todo is not projected.
STATUS_CATEGORY = {IssueStatus.BACKLOG: StateCategory.BACKLOG, IssueStatus.IN_PROGRESS: StateCategory.ACTIVE,
                   IssueStatus.IN_REVIEW: StateCategory.REVIEW, IssueStatus.BLOCKED: StateCategory.BLOCKED,
                   IssueStatus.DONE: StateCategory.TERMINAL, IssueStatus.CANCELLED: StateCategory.TERMINAL}
# state_mapping sections whose keys are not state names, or that hold another container's overrides (Jira/Asana
# projects, Linear teams, Trello boards and list ids, Notion databases).
NOT_STATE_NAMES = {"types", "categories", "teams", "projects", "priorities", "issuetype", "labels_override_closed",
                   "boards", "listids", "databases"}
OPERATION = {OutboundKind.COMMENT: "post_comment", OutboundKind.BACKLINK: "set_backlink",
             OutboundKind.STATE: "update_task_state", OutboundKind.FIELDS: "set_fields"}


# ------------------------------------------------------------------------------------------ policy
def write_policy(link: TaskLink, instance: ConnectorInstance | None = None) -> dict:
    """§10.2 toggles: protocol defaults < instance write policy < link overrides."""
    instance = instance or link.instance
    return {**default_write_policy(), **(instance.write_policy or {}), **(link.write_policy or {})}


def toggle_on(link: TaskLink, name: str) -> bool:
    return bool(write_policy(link).get(name))


def write_refusal(link: TaskLink, kind: str, *, toggle: str | None = None, field: str | None = None) -> str:
    """Why this write may not happen ('' when it may): sync mode, capability, toggle, field policy."""
    if link.status == LinkStatus.UNLINKED:
        return "link unlinked"
    if link.sync_mode not in WRITE_SYNC_MODES:
        return f"sync mode {link.sync_mode}"
    try:
        operations = adapter_class(link.provider_key).capabilities.operations
    except LookupError:
        return f"unknown provider {link.provider_key}"
    if OPERATION[kind] not in operations:
        return f"provider cannot {OPERATION[kind]}"
    if toggle and not toggle_on(link, toggle):
        return f"{toggle} is off"
    if field and (link.field_policy or {}).get(field, "external") == "external":
        return f"fieldPolicy.{field} is external"
    return ""


def closure_allowed(link: TaskLink) -> bool:
    """§10.3: done/cancelled project to a terminal state only when fieldPolicy.state gives Paperclip the
    closure (``paperclip``, or ``closure: paperclip`` next to a shared state)."""
    policy = link.field_policy or {}
    return policy.get("state") == "paperclip" or policy.get("closure") == "paperclip"


def state_name_for(link: TaskLink, category: str) -> str | None:
    """The inverse of the state mapping (§10.3): the operator-mapped state name of a category, or None.
    ``config.outboundStates`` ({category: name}) wins; otherwise the first mapped name in key order (sorted,
    case-insensitively: PostgreSQL's jsonb does not keep the order an operator wrote, so "first as written"
    would differ between databases). Name ``outboundStates`` where several states share a category."""
    instance = link.instance
    explicit = (instance.config or {}).get("outboundStates") or {}
    if isinstance(explicit.get(category), str) and explicit[category].strip():
        return explicit[category].strip()

    def walk(mapping):
        if isinstance(mapping, dict):
            items = sorted(mapping.items(), key=lambda kv: (str(kv[0]).lower(), str(kv[0])))
        elif isinstance(mapping, (list, tuple)):
            items = [tuple(p) for p in mapping if isinstance(p, (list, tuple)) and len(p) == 2]
        else:
            return None
        for key, value in items:
            if str(key).lower() in NOT_STATE_NAMES:
                continue
            if isinstance(value, str) and value == category:
                return str(key)
            if isinstance(value, (dict, list, tuple)):
                found = walk(value)
                if found:
                    return found
        return None

    return walk(instance.state_mapping or {})


def issue_url(issue) -> str:
    return f"{conf('PUBLIC_BASE_URL').rstrip('/')}/issues/{issue.identifier}"


def attribution(agent_name: str | None, issue) -> str:
    who = f"{agent_name} via Paperclip" if agent_name else "Paperclip"
    return f"**{who}** · [{issue.identifier}]({issue_url(issue)})"


def marker(effect_id) -> str:
    return MARKER.format(id=effect_id)


# ---------------------------------------------------------------------------------------- recording
def _links_of(issue_id):
    return list(TaskLink.objects.select_related("instance").filter(issue_id=issue_id)
                .exclude(status=LinkStatus.UNLINKED))


def effect_record(*, link: TaskLink, kind: str, source_id: str, payload: dict,
                  milestone: str = "") -> OutboundEffect | None:
    """Insert the effect once per (link, kind, source id) in the caller's transaction and drain it
    after commit. Progress milestones are debounced per link (batched into one pending comment)."""
    now = timezone.now()
    due = now
    payload = {**payload, **({"milestone": milestone} if milestone else {})}
    if kind == OutboundKind.COMMENT and milestone and milestone not in UNDEBOUNCED_MILESTONES:
        # Callers hold the issue's row lock (every issue change takes it), which serializes this per link;
        # the link row is not locked here (the inbound path locks link+issue together: no lock cycle).
        row = TaskLink.objects.only("pk", "last_milestone_at").get(pk=link.pk)
        pending = (OutboundEffect.objects.select_for_update().filter(
            link=link, kind=OutboundKind.COMMENT, status=OutboundStatus.PENDING, payload__milestone=milestone,
            attempts=0, last_attempt_at__isnull=True).order_by("-id").first())  # the latest batch
        lines = [*pending.payload.get("lines", []), *payload.get("lines", [])] if pending is not None else []
        if pending is not None and len(lines) <= MAX_BATCHED_LINES:
            # batch into the comment already waiting for its window (one comment per 5 minutes)
            pending.payload = {**pending.payload, "lines": lines}
            pending.save(update_fields=["payload"])
            return pending
        # A full batch takes no more lines: this one starts the next comment (mirrored comments and
        # links are never dropped, §10.2), due with the window.
        if row.last_milestone_at and row.last_milestone_at + MILESTONE_DEBOUNCE > now:
            due = row.last_milestone_at + MILESTONE_DEBOUNCE
        TaskLink.objects.filter(pk=link.pk).update(last_milestone_at=due)
    effect, created = OutboundEffect.objects.get_or_create(
        link=link, kind=kind, source_id=source_id[:300],
        defaults={"company_id": link.company_id, "instance_id": link.instance_id, "payload": payload,
                  "next_attempt_at": due})
    if created:
        _kick(effect.pk, due)
    return effect


def _kick(effect_id, due):
    from .kicks import outbound_delivery

    transaction.on_commit(lambda: outbound_delivery(effect_id, max((due - timezone.now()).total_seconds(), 0)))


def _comment(link: TaskLink, source_id: str, milestone: str, text: str, agent_name: str | None, toggle: str):
    if write_refusal(link, OutboundKind.COMMENT, toggle=toggle):
        return None
    return effect_record(link=link, kind=OutboundKind.COMMENT, source_id=source_id, milestone=milestone,
                         payload={"lines": [text], "agent": agent_name or "", "issueId": str(link.issue_id)})


def _agent_name(issue) -> str | None:
    agent = issue.assignee_agent if issue.assignee_agent_id else None
    return agent.name if agent else None


def _agent_name_of(agent_id) -> str | None:
    return Agent.objects.filter(pk=agent_id).values_list("name", flat=True).first()


def status_changed(*, issue, old: str, new: str, actor=None, previous_agent_id=None):
    """§10.3 status projection for every linked, write-enabled link of the issue. ``previous_agent_id``:
    the agent assignee the same change replaced (a reassignment), named when the claim it held ends."""
    stamp = (issue.updated_at or timezone.now()).isoformat()
    for link in _links_of(issue.pk):
        if write_refusal(link, OutboundKind.COMMENT) and write_refusal(link, OutboundKind.STATE):
            continue
        name = _agent_name(issue)
        if old == IssueStatus.IN_PROGRESS and new == IssueStatus.TODO:
            # §10.3 release state: the claim ended without a result; the task waits for the next pick-up.
            # A release clears the assignee (upstream), so the releasing agent names itself; when a board
            # user ended the claim (a release, a reassignment), the message names the agent that held it,
            # never the new assignee (§10.4 attribution).
            releaser = getattr(getattr(actor, "agent", None), "name", None)
            if releaser:
                text = f"{releaser} released this task; it is back in the queue in Paperclip."
            else:
                holder = _agent_name_of(previous_agent_id) if previous_agent_id else name
                text = f"{holder or 'The agent'} no longer works on this task; it is back in the queue in Paperclip."
            _comment(link, f"release:{stamp}", "release", text, releaser or None, "postProgressComments")
            continue
        category = STATUS_CATEGORY.get(new)
        if category is None or link.external_state_category == category:
            continue  # the task is there already (the change may have come from this tracker: no echo)
        source = f"status:{new}:{stamp}"
        state_ok = not write_refusal(link, OutboundKind.STATE, toggle="projectStatus", field="state")
        if category == StateCategory.TERMINAL:
            target = projection_target(link, StateCategory.TERMINAL) if closure_allowed(link) else None
            if target is not None and state_ok:
                closed = f"Work is {new} in Paperclip. Closing the task is left to you here."
                _state_effect(link, source, target, category, new, fallback=closed, agent=name)
                where = f"'{target}'" if target else "its closed state"
                _comment(link, f"done:{stamp}", "done", f"Marked {new} in Paperclip; the task was moved to {where}.",
                         name, "postProgressComments")
            else:
                _comment(link, f"done:{stamp}", "done",
                         f"Work is {new} in Paperclip. Closing the task is left to you here.", name,
                         "postProgressComments")
            continue
        if category == StateCategory.REVIEW:
            target = projection_target(link, StateCategory.REVIEW)
            if target and state_ok:
                _state_effect(link, source, target, category, new)
                _comment(link, f"review:{stamp}", "review", "Ready for review.", name, "postProgressComments")
            elif toggle_on(link, "projectStatus"):
                if target == "" and state_ok:
                    _state_effect(link, source, target, category, new)  # a review state, if the workflow has one
                _comment(link, f"review:{stamp}", "review", "Review requested: the work is ready for review.",
                         name, "projectStatus")
            continue
        target = projection_target(link, category)
        status_text = f"Status in Paperclip is now '{new}'."
        if target is not None and state_ok:
            _state_effect(link, source, target, category, new, fallback=status_text, agent=name)
        elif toggle_on(link, "projectStatus"):
            _comment(link, f"status:{new}:{stamp}", "state", status_text, name, "projectStatus")


def projection_target(link: TaskLink, category: str) -> str | None:
    """The state to project to: its mapped name; ``""`` when the mapping names types/categories only and
    the provider can find a mapped state of that category in the task's live workflow at delivery;
    None when there is no mapped state (the change is projected as a comment)."""
    name = state_name_for(link, category)
    if name:
        return name
    try:
        cls = adapter_class(link.provider_key)
    except LookupError:
        return None
    return "" if cls.state_for_category is not TaskSourceAdapter.state_for_category else None


def _state_effect(link, source, target: str, category: str, status: str, *, fallback: str = "", agent=None):
    payload = {"stateName": target, "category": category, "status": status}
    if fallback and not target:
        payload["fallback"] = {"text": fallback, "agent": agent or ""}  # posted when no state is found
    return effect_record(link=link, kind=OutboundKind.STATE, source_id=source, payload=payload)


def claimed(*, issue, run_id):
    """Checkout is the claim (§9.2); projected as a status comment (§10.3 claim/run state)."""
    # One effect per claim, not per run: a run may claim again after a release (§4.3 keys effects by
    # their source; the claim's stamp tells the claims apart, a retried delivery of one keeps its key).
    claim = f"claim:{run_id}:{issue.execution_locked_at.isoformat() if issue.execution_locked_at else ''}"
    for link in _links_of(issue.pk):
        name = _agent_name(issue)
        _comment(link, claim, "claim", f"{name or 'An agent'} picked this up (run {str(run_id)[:8]}).",
                 name, "postProgressComments")
    if issue.status == IssueStatus.IN_PROGRESS:
        status_changed(issue=issue, old="", new=IssueStatus.IN_PROGRESS)  # checkout moved it to in_progress


def agent_comment(*, comment):
    """mirrorAgentComments (off by default) mirrors an agent's whole comment. Otherwise an agent's
    comments stay in Paperclip: §10.2's progress comments are the milestones (claimed, plan ready,
    PR opened, review requested, done, a failed run), each posted from the event that is that
    milestone, never per-heartbeat chatter."""
    if not comment.author_agent_id:
        return
    links = [link for link in _links_of(comment.issue_id) if toggle_on(link, "mirrorAgentComments")]
    if not links:
        return
    agent_name = comment.author_agent.name
    for link in links:
        _comment(link, f"comment:{comment.pk}", "mirror", comment.body, agent_name, "mirrorAgentComments")


FAILED_RUN_STATUSES = ("failed", "timed_out", "interrupted")


def run_finished(*, run):
    """A failed or abandoned run is reported on the tracker visibly, with what happens next."""
    if run.status not in FAILED_RUN_STATUSES or run.issue_id is None:
        return
    from issues.services.run_policy import run_policy_for
    from issues.services.runs import next_retry_attempt

    links = _links_of(run.issue_id)
    if not links:
        return
    attempt = next_retry_attempt(run, run.agent)  # the host's own retry rule, not a guess at it
    if attempt is not None:
        limit = run_policy_for(agent=run.agent, issue=run.issue).max_retries
        nxt = f"Paperclip retries automatically (attempt {attempt} of {limit})."
    else:
        nxt = "No automatic retry is left: the issue waits for someone in Paperclip to look at it."
    reason = (run.error or run.liveness_reason or run.status).strip().splitlines()[0][:300] if (
        run.error or run.liveness_reason) else run.status
    for link in links:
        _comment(link, f"run:{run.pk}:failure", "failure",
                 f"The agent run {run.status.replace('_', ' ')}: {reason}. {nxt}", run.agent.name,
                 "postProgressComments")


# -------------------------------------------------------------------------------- field pushes (§11.1)
# Issue attributes pushed when Paperclip owns or shares them; also their fieldPolicy / base snapshot keys.
PUSHED_FIELDS = ("title", "description", "priority")
PUSH_SOURCE = "fields:"


def pushable_fields(link: TaskLink, fields) -> list[str]:
    """The fields a Paperclip-side edit may write to the link's tracker now: settable by the provider,
    not external-owned (owner ``paperclip`` or ``shared``), sync mode writes, and no open conflict on
    the field (its resolution decides what the tracker gets)."""
    from connectors.choices import ConflictStatus
    from connectors.models import Conflict

    try:  # what the provider's set_fields takes among them (GitHub Issues has no priority field)
        settable = adapter_class(link.provider_key).capabilities.settable_fields
    except LookupError:
        return []
    names = [f for f in fields if f in settable and not write_refusal(link, OutboundKind.FIELDS, field=f)]
    if not names:
        return []
    held = set(Conflict.objects.filter(link=link, status=ConflictStatus.OPEN, field__in=names)
               .values_list("field", flat=True))
    return [f for f in names if f not in held]


def fields_changed(*, issue, fields, actor=None):
    """Paperclip-side edits of synced fields become one FIELDS effect per link and change (keyed by
    the issue's update stamp). An effect still waiting for its first attempt absorbs later edits, and
    delivery writes the issue's values as they are then, so the tracker converges on the last edit.
    The connector's own edits (inbound applies, SYSTEM actor) are filtered out by the receiver."""
    stamp = (issue.updated_at or timezone.now()).isoformat()
    for link in _links_of(issue.pk):
        names = pushable_fields(link, fields)
        if not names:
            continue
        values = {name: getattr(issue, name) for name in names}
        pending = (OutboundEffect.objects.select_for_update()
                   .filter(link=link, kind=OutboundKind.FIELDS, status=OutboundStatus.PENDING, attempts=0,
                           source_id__startswith=PUSH_SOURCE).order_by("id").first())
        if pending is not None:
            pending.payload = {**pending.payload, "fields": {**pending.payload.get("fields", {}), **values}}
            pending.save(update_fields=["payload"])
            continue
        effect_record(link=link, kind=OutboundKind.FIELDS, source_id=f"{PUSH_SOURCE}{stamp}",
                      payload={"fields": values, "issueId": str(issue.pk)})


# ------------------------------------------------------------------------ artifact links, plan ready
def _md_link(text: str, url: str) -> str:
    text = " ".join((text or "").replace("[", "(").replace("]", ")").split())[:200]
    return f"[{text or url}]({url})" if url else f"`{text}`"


def _actor_name(actor) -> str | None:
    return actor.agent.name if actor is not None and getattr(actor, "agent", None) is not None else None


WORK_PRODUCT_LABEL = {"pull_request": "PR opened", "branch": "Branch", "artifact": "Artifact",
                      "document": "Document"}


def artifact_posted(*, work_product, actor=None):
    """postArtifactLinks (§10.2): a concise comment linking the work product. An opened pull request is
    posted at once (milestone ``pr``); branches, documents and artifacts are batched per link with the
    5-minute milestone debounce."""
    label = WORK_PRODUCT_LABEL.get(work_product.kind, work_product.kind)
    text = f"{label}: {_md_link(work_product.title or work_product.external_id, work_product.url)}"
    if work_product.status:
        text += f" ({work_product.status[:32]})"
    milestone = "pr" if work_product.kind == "pull_request" else "artifact"
    for link in _links_of(work_product.issue_id):
        _comment(link, f"artifact:{work_product.pk}", milestone, text, _actor_name(actor), "postArtifactLinks")


PLAN_KEY = "plan"


def document_url(issue, key: str) -> str:
    return f"{issue_url(issue)}/documents/{key}/"


def plan_written(*, document, revision, actor=None):
    """The "plan ready" milestone (§10.2): the first write of the issue's ``plan`` document while the
    issue is linked posts one debounced progress comment linking it; later revisions are not
    re-announced (milestones, not chatter)."""
    if document.key != PLAN_KEY:
        return
    issue = document.issue
    text = f"Plan ready: {_md_link(document.title or 'plan', document_url(issue, document.key))}"
    source = f"plan:{document.pk}"
    for link in _links_of(issue.pk):
        if OutboundEffect.objects.filter(link=link, kind=OutboundKind.COMMENT, source_id=source).exists():
            continue  # announced already (a pending one would otherwise get the line batched twice)
        _comment(link, source, "plan", text, _actor_name(actor), "postProgressComments")


# ---------------------------------------------------------------------------------------- delivery
def _render(effect: OutboundEffect, link: TaskLink) -> str:
    payload = effect.payload or {}
    lines = payload.get("lines") or ([payload["body"]] if payload.get("body") else [])
    text = "\n\n".join(lines) if payload.get("milestone") == "mirror" else "\n".join(
        f"- {line}" if len(lines) > 1 else line for line in lines)
    head = attribution(payload.get("agent") or None, link.issue)
    return f"{head}\n\n{text}\n\n{marker(effect.pk)}"


def _refusal_at_delivery(effect: OutboundEffect, link: TaskLink) -> str:
    milestone = (effect.payload or {}).get("milestone", "")
    toggle = {"mirror": "mirrorAgentComments", "state": "projectStatus", "pr": "postArtifactLinks",
              "artifact": "postArtifactLinks",
              "transcript": "postTranscripts"}.get(milestone, "postProgressComments") \
        if effect.kind == OutboundKind.COMMENT and milestone else None
    if effect.kind == OutboundKind.COMMENT and (effect.payload or {}).get("tool"):
        toggle = "postProgressComments"  # agent tool comments (connectors.services.agent_tools.COMMENT_TOGGLE)
    if effect.kind == OutboundKind.STATE:
        return write_refusal(link, effect.kind, toggle="projectStatus", field="state")
    if effect.kind == OutboundKind.BACKLINK:
        return write_refusal(link, effect.kind, toggle="postBacklink")
    if effect.kind == OutboundKind.FIELDS:
        names = list((effect.payload or {}).get("fields", {}))
        source = str(effect.source_id)
        if source.startswith(PUSH_SOURCE) and names and not pushable_fields(link, names):
            # a push goes ahead with the fields still allowed; none left -> not written
            return next((r for r in (write_refusal(link, effect.kind, field=f) for f in names) if r),
                        "every field has an open conflict")
        if not source.startswith(("conflict:", PUSH_SOURCE)):
            for field in names:
                refusal = write_refusal(link, effect.kind, field=field)
                if refusal:
                    return refusal
        return write_refusal(link, effect.kind)
    return write_refusal(link, effect.kind, toggle=toggle)


RELEASED = ("done", "cancelled", "failed", "parked")  # outcomes after which the link's next effect may go


def effect_deliver(*, effect_id) -> str:
    """Deliver one due effect, then drain its link's next due effects in order (each one claimed like
    the first). Returns the first effect's outcome."""
    result, link_id = _deliver_one(effect_id)
    outcome = result
    for _ in range(int(conf("SWEEP_BATCH"))):
        if outcome not in RELEASED:
            break
        following = outbox.next_due(link_id)
        if following is None:
            break
        outcome, _ = _deliver_one(following)
    return result


def _deliver_one(effect_id) -> tuple[str, object]:
    """Claim one due effect under a lease, write through the adapter outside any transaction, then
    record the outcome. It waits while an earlier effect of its link is active (order per link). A
    retry after a lost outcome (the write may have reached the provider) looks for the effect's
    marker first, so a comment is posted once."""
    now = timezone.now()
    with transaction.atomic():
        effect = (OutboundEffect.objects.select_for_update(skip_locked=True)
                  .filter(pk=effect_id, status=OutboundStatus.PENDING).first())
        if effect is None:
            return "not_pending", None
        if effect.next_attempt_at and effect.next_attempt_at > now:
            return "not_due", effect.link_id
        if outbox.blocker(effect, now):
            return "waiting", effect.link_id  # the earlier effect's delivery drains this one
        link = TaskLink.objects.select_related("instance", "issue").get(pk=effect.link_id)
        if link.instance.status == InstanceStatus.PAUSED or link.status == LinkStatus.PAUSED:
            return "held", link.pk  # resumes with the link/instance (the sweep retries)
        refusal = _refusal_at_delivery(effect, link)
        if refusal:
            effect.status, effect.error_message = OutboundStatus.CANCELLED, f"not written: {refusal}"
            effect.save(update_fields=["status", "error_message"])
            return "cancelled", link.pk
        until = outbox.deferred_until(link.instance, now)
        if until:  # the provider's rate limit: wait for its reset without spending an attempt
            OutboundEffect.objects.filter(pk=effect.pk).update(next_attempt_at=until)
            return "deferred", link.pk
        resumed = effect.attempts > 0 or effect.last_attempt_at is not None  # a replay keeps the marker check
        effect.attempts += 1
        effect.last_attempt_at, effect.next_attempt_at = now, now + outbox.lease()
        effect.save(update_fields=["attempts", "last_attempt_at", "next_attempt_at"])
    return _write(effect, link, resumed), link.pk


@logctx.outbound_logged  # §12.1: one structured line per delivery outcome
def _write(effect: OutboundEffect, link: TaskLink, resumed: bool) -> str:
    written = {}
    try:
        if effect.kind == OutboundKind.FIELDS:
            written, skipped = _fields_write(effect, link)
            if skipped and not written:
                OutboundEffect.objects.filter(pk=effect.pk).update(
                    status=OutboundStatus.CANCELLED, next_attempt_at=None,
                    error_message=f"not written: {'; '.join(skipped) or 'nothing to write'}")
                return "cancelled"
            external_ref = ""  # no provider object of its own (echo matching is by the advanced base)
        else:
            external_ref = _perform(effect, link, resumed)
    except NotImplementedError:
        OutboundEffect.objects.filter(pk=effect.pk).update(status=OutboundStatus.CANCELLED, next_attempt_at=None,
                                                           error_message="the provider does not implement it")
        return "cancelled"
    except NoMappedState as exc:
        with transaction.atomic():
            OutboundEffect.objects.filter(pk=effect.pk).update(status=OutboundStatus.CANCELLED, next_attempt_at=None,
                                                               error_message=f"not written: {exc}")
            fallback = (effect.payload or {}).get("fallback")
            if fallback:  # §10.3: a status without a mapped state is projected as a comment
                _comment(link, f"{effect.source_id}:comment", "state", fallback["text"], fallback.get("agent"),
                         "projectStatus")
        return "cancelled"
    except Exception as exc:  # provider errors and anything else: retried over the horizon, then parked
        return outbox.failure_record(effect, link, exc)
    with transaction.atomic():
        OutboundEffect.objects.filter(pk=effect.pk).update(status=OutboundStatus.DONE, external_ref=external_ref or "",
                                                           done_at=timezone.now(), error_message="",
                                                           error_category="", next_attempt_at=None)
        if link.instance.auth_error_at and credentials_ok(link.instance, cause=f"outbound {effect.kind} written"):
            outbox.pending_kick(link.instance_id)  # the provider took a write: the credentials work again
        fields = {"last_outbound_at": timezone.now()}
        if effect.kind == OutboundKind.STATE:
            # what we wrote is now the tracker's state: the echo is not a change (and not a conflict)
            row = TaskLink.objects.select_for_update().get(pk=link.pk)
            base = dict(row.base_snapshot or {})
            ext = dict(base.get("external") or {})
            ext.update(state=external_ref or effect.payload.get("stateName"), category=effect.payload.get("category"))
            fields.update(external_state_name=(external_ref or effect.payload.get("stateName") or "")[:200],
                          external_state_category=effect.payload.get("category") or "",
                          base_snapshot={**base, "external": ext})
        if written:
            # what we wrote is what the tracker now holds and what Paperclip holds: the base of both
            # sides, so the tracker's echo is neither a change nor a conflict (§11.1)
            row = TaskLink.objects.select_for_update().get(pk=link.pk)
            base = dict(row.base_snapshot or {})
            ext, pc = dict(base.get("external") or {}), dict(base.get("paperclip") or {})
            for field, (seen, paperclip) in written.items():
                ext[field] = seen
                if paperclip is not None:
                    pc[field] = paperclip
            fields["base_snapshot"] = {**base, "external": ext, "paperclip": pc}
            if "title" in written:
                fields["external_title"] = str(written["title"][0] or "")[:500]
        TaskLink.objects.filter(pk=link.pk).update(**fields)
        activity_record(actor=SYSTEM, company_id=link.company_id, action="connector.outbound_written",
                        entity_type="connector_link", entity_id=link.pk,
                        details={"effectId": effect.pk, "kind": effect.kind, "sourceId": effect.source_id,
                                 "externalRef": external_ref or "", "attempts": effect.attempts,
                                 **({"fields": sorted(written)} if written else {}),
                                 "instanceId": str(link.instance_id), "externalKey": link.external_key})
    return "done"


class NoMappedState(Exception):
    """A state projection by category found no mapped state of it: projected as a comment instead."""


def _perform(effect: OutboundEffect, link: TaskLink, resumed: bool) -> str:
    adapter = adapter_for(link.instance)
    ref = ExternalTaskRef(external_id=link.external_task_id, external_key=link.external_key or None)
    payload = effect.payload or {}
    if effect.kind == OutboundKind.COMMENT:
        if resumed:
            found = _find_marked(adapter, ref, marker(effect.pk))
            if found:
                return found
        return str(adapter.post_comment(ref, _render(effect, link)) or "")
    if effect.kind == OutboundKind.STATE:
        name = payload.get("stateName") or adapter.state_for_category(ref, payload["category"])
        if not name:
            raise NoMappedState(f"no mapped {payload['category']} state in the task's workflow")
        adapter.update_task_state(ref, name)
        return name
    if effect.kind == OutboundKind.BACKLINK:
        adapter.set_backlink(ref, payload.get("url") or issue_url(link.issue))
        return ""
    raise NotImplementedError(effect.kind)


def _stub_task(link: TaskLink, *, title: str = "", description: str | None = None) -> ExternalTask:
    return ExternalTask(provider_key=link.provider_key, external_id=link.external_task_id,
                        external_key=link.external_key or None, title=title, description=description,
                        state=ExternalState(name="", category=""), url=link.external_url or None)


def _tracker_value(link: TaskLink, field: str, value):
    """A Paperclip value as the tracker's set_fields takes it. An imported description starts with the
    connector's attribution head (§7.3): it is Paperclip's framing, not tracker text, so it stays here."""
    if field == "priority":
        from .conflicts import PRIORITY_NUMBER

        return PRIORITY_NUMBER.get(value)
    if field == "description":
        from .links import provider_label

        head = content.render_description(_stub_task(link), provider_label(link.instance))
        value = value or ""
        return value[len(head):].lstrip("\n") if value.startswith(head) else value
    return value


def _seen_value(link: TaskLink, field: str, written):
    """The tracker value the inbound pipeline will compute from what we wrote (base_snapshot.external)."""
    if field == "title":
        return content.render_title(_stub_task(link, title=written))
    if field == "description":
        from .links import provider_label

        return content.render_description(_stub_task(link, description=written), provider_label(link.instance))
    return written


def _fields_write(effect: OutboundEffect, link: TaskLink) -> tuple[dict, list[str]]:
    """Write a field effect. A push (``fields:``) writes the issue's current values of the fields it
    may still write, after reading the task back: a field the tracker changed since the base is not
    overwritten (its webhook reaches the inbound three-way, which opens the conflict). Returns
    ``{field: (tracker value seen, paperclip value)}`` for the fields now equal on both sides, and
    why the others were skipped."""
    from .links import external_snapshot, provider_label

    adapter = adapter_for(link.instance)
    ref = ExternalTaskRef(external_id=link.external_task_id, external_key=link.external_key or None)
    wanted = dict((effect.payload or {}).get("fields") or {})
    if not str(effect.source_id).startswith(PUSH_SOURCE):  # conflict resolutions: the chosen value, as is
        out = {k: _tracker_value(link, k, v) if k == "description" else v for k, v in wanted.items()}
        adapter.set_fields(ref, out)
        return {k: (_seen_value(link, k, v), None) for k, v in out.items() if k in PUSHED_FIELDS}, []
    skipped = []
    names = pushable_fields(link, wanted)
    skipped += [f"{f}: {write_refusal(link, OutboundKind.FIELDS, field=f) or 'open conflict'}"
                for f in wanted if f not in names]
    if not names:
        return {}, skipped
    base_ext = (link.base_snapshot or {}).get("external") or {}
    task = adapter.get_task(ref)
    current = external_snapshot(task, provider_label(link.instance))
    out, written = {}, {}
    for field in names:
        if field in base_ext and current.get(field) != base_ext.get(field):
            skipped.append(f"{field} changed on the tracker since the last sync (left to the inbound three-way)")
            continue
        paperclip = getattr(link.issue, field)
        value = _tracker_value(link, field, paperclip)
        seen = _seen_value(link, field, value)
        if seen != current.get(field):
            out[field] = value
        written[field] = (seen, paperclip)
    if out:
        adapter.set_fields(ref, out)
    if len(written) < len(names):
        _diverged(effect, link, task)
    return written, skipped


def _diverged(effect: OutboundEffect, link: TaskLink, task: ExternalTask):
    """The tracker moved on under a push: queue what we read as an inbound event, so the three-way
    runs (and opens the conflict) even if the tracker's own webhook is late or lost."""
    from connectors.choices import EventSource
    from connectors.providers.base import EventKind, VerifiedEvent

    from .inbound import event_store, kick

    with transaction.atomic():
        event_store(instance=link.instance, source=EventSource.RESYNC, event=VerifiedEvent(
            event_id=f"outbound:{effect.pk}:diverged", kind=EventKind.TASK_UPSERTED, action="outbound.diverged",
            external_task_id=task.external_id, task=task, container_id=task.container_id))
        kick(link.instance_id, task.external_id)


def _find_marked(adapter, ref, mark: str) -> str | None:
    cursor = None
    for _ in range(20):
        page = adapter.list_comments(ref, cursor)
        for comment in page.items:
            if mark in (comment.body or ""):
                return comment.external_comment_id
        if not page.cursor or page.cursor == cursor:
            return None
        cursor = page.cursor
    return None


def effects_due(limit: int | None = None) -> list[int]:
    """Pending effects whose time has come (new, retry due, or a lease that expired) and that no
    earlier effect of their link holds back."""
    return outbox.heads_due(limit)


def recent_outbound_ref(instance, external_ref: str) -> bool:
    """Echo suppression (§10.4): an inbound object we wrote ourselves recently."""
    if not external_ref:
        return False
    return OutboundEffect.objects.filter(instance=instance, external_ref=str(external_ref),
                                         done_at__gte=timezone.now() - RECENT_OUTBOUND).exists()
