"""Executing parsed ``/paperclip`` commands (see commands.py for syntax and authorization)."""
from __future__ import annotations

from django.db import transaction

from connectors.choices import CommandPolicy, ErrorCategory, LinkStatus, OutboundKind, RoutingRuleKind
from connectors.models import ConnectorInstance, RoutingRule, TaskLink
from connectors.providers.base import ExternalComment
from issues.actors import SYSTEM
from issues.choices import TERMINAL_ISSUE_STATUSES, IssueStatus
from issues.models import Issue
from issues.services.activity import activity_record
from issues.services.issues import issue_update

from . import content, links, routing, run_modes
from .commands import VERBS, Command
from .common import link_set_status, sync_error_record


def _authorized(instance: ConnectorInstance, comment: ExternalComment) -> tuple[bool, str]:
    if instance.command_policy == CommandPolicy.DISABLED:
        return False, "commands are disabled for this connector"
    if instance.command_policy == CommandPolicy.MAPPED_USERS:
        author = comment.author
        for rule in RoutingRule.objects.filter(instance=instance, kind=RoutingRuleKind.USER_MAPPING, enabled=True):
            m = rule.match or {}
            ids = {str(v).lower() for v in (m.get("externalUserIds") or [m.get("externalUserId")]) if v}
            ids |= {str(v).lower() for v in (m.get("logins") or [m.get("login")]) if v}
            if author and (author.external_user_id.lower() in ids or author.display_name.lower() in ids):
                return True, ""
        return False, "only mapped users may run commands"
    return True, ""


def commands_execute(*, instance: ConnectorInstance, link: TaskLink, comment: ExternalComment,
                     commands: list[Command], key: str) -> list[str]:
    who = content.actor_label(comment.author)
    replies = []
    ok, why = _authorized(instance, comment)
    observer = run_modes.is_observer(link)
    for index, command in enumerate(commands):
        if observer:
            # §4.2.1: an observer link mutates neither side: no effect, and no reply (a reply is a write
            # on one side); only the audit entry below says the command was seen and ignored.
            text = f"ignored: {run_modes.OBSERVER_TEXT}"
        elif not ok:
            text = f"rejected: {why}"
        else:
            text = _run(instance, link, command, who, key)
        replies.append(text)
        if not observer:
            _reply(instance, link, comment, command, index, text, who, key)
        activity_record(actor=SYSTEM, company_id=link.company_id, action="connector.command",
                        entity_type="connector_link", entity_id=link.pk,
                        details={"instanceId": str(instance.pk), "verb": command.verb, "line": command.line,
                                 "outcome": text, "externalActor": content.actor_dict(comment.author),
                                 "externalCommentId": comment.external_comment_id, "idempotencyKey": key})
    return replies


def _run(instance, link: TaskLink, command: Command, who: str, key: str) -> str:
    verb = command.verb
    if verb not in VERBS:
        return f"rejected: unknown command '{verb or '(none)'}'; use one of: {', '.join(VERBS)}"
    issue = Issue.objects.select_for_update().get(pk=link.issue_id)
    if verb == "status":
        owner = issue.assignee_agent.name if issue.assignee_agent_id else "nobody"
        return (f"{issue.identifier} is {issue.status}, assigned to {owner}; link {link.status}"
                + (f" ({link.status_detail})" if link.status_detail else ""))
    if verb == "pause":
        if link.status == LinkStatus.PAUSED:
            return "already paused"
        link.paused_from_status = link.status
        link_set_status(link, LinkStatus.PAUSED, f"/paperclip pause by {who}", detail=f"paused by {who}", key=key,
                        save_fields=("paused_from_status",))
        return "sync paused for this task"
    if verb == "resume":
        if link.status != LinkStatus.PAUSED:
            return "not paused"
        target = link.paused_from_status or LinkStatus.HEALTHY
        link.paused_from_status = ""
        link_set_status(link, target, f"/paperclip resume by {who}", detail="", key=key,
                        save_fields=("paused_from_status",))
        from .interventions import resync_after_commit

        resync_after_commit(link)
        return "sync resumed; a resync follows"
    # assign
    if not command.args:
        return "rejected: name an agent, e.g. /paperclip assign <agent>"
    name = " ".join(command.args)
    agent = routing.agent_by_name(instance.company_id, name)
    if agent is None:
        return f"rejected: unknown agent '{name}'"
    if agent.status in routing.UNAVAILABLE:
        sync_error_record(instance=instance, category=ErrorCategory.COMMAND, link=link,
                          message=f"/paperclip assign {agent.name} rejected: agent is {agent.status}")
        return f"rejected: agent '{agent.name}' is {agent.status}"
    link.routing = {**(link.routing or {}), "commandAgent": agent.name, "kind": RoutingRuleKind.COMMENT_COMMAND,
                    "agentId": str(agent.pk), "agentName": agent.name, "reason": f"/paperclip assign by {who}"}
    link.save(update_fields=["routing", "updated_at"])
    if issue.assignee_agent_id == agent.pk:
        return f"already assigned to {agent.name}"
    if issue.status in TERMINAL_ISSUE_STATUSES:
        return f"rejected: {issue.identifier} is {issue.status}"
    if issue.status == IssueStatus.IN_PROGRESS:
        links.note(issue, f"Handoff requested by {who} via /paperclip assign: {agent.name} should take over. The "
                          f"issue is checked out, so the current owner decides.", link=link, key=key, kind="handoff")
        return f"{issue.identifier} is checked out; a handoff to {agent.name} was requested"
    issue_update(actor=SYSTEM, issue=issue, changes={"assignee_agent_id": agent.pk},
                 assignment_wake=run_modes.connector_may_wake(link))
    return f"assigned to {agent.name}"


def _reply(instance, link: TaskLink, comment: ExternalComment, command: Command, index: int, text: str, who: str,
           key: str):
    """§8.2: externally when writes are allowed, on the Paperclip issue otherwise."""
    from .outbound import effect_record, write_refusal

    if not write_refusal(link, OutboundKind.COMMENT):
        body = f"{content.MARKER_PREFIX}command-reply -->\n`{command.line}` ({who}): {text}"
        effect_record(link=link, kind=OutboundKind.COMMENT,
                      source_id=f"command:{comment.external_comment_id}:{index}", payload={"body": body})
        return
    with transaction.atomic():
        issue = Issue.objects.get(pk=link.issue_id)
        links.note(issue, f"Command from {who} on {link.external_key or link.external_task_id}: `{command.line}` → "
                          f"{text}", link=link, key=key, kind="command_reply")
