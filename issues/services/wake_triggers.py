"""Waiting work wakes by itself (issue #13): blockers resolved, children finished, mentions,
interactions answered. Reason names are upstream Paperclip's (paperclip-api.md §3), so agent
prompts written for Paperclip recognise them.

Every wake here goes through :func:`.wakeups.agent_wakeup` (skip rules, coalescing, deferral,
idempotency). The issue triggers run inside the transaction of the status change that caused
them, so a rolled-back finish wakes nobody, and each carries an idempotency key built from the
set it reports on, so a retried finish wakes once while a different set wakes again.
"""
from __future__ import annotations

import hashlib

from issues import mentions
from issues.actors import SYSTEM
from issues.choices import TERMINAL_ISSUE_STATUSES, AuthorType, IssueStatus, RelationKind, WakeSource
from issues.models import Agent, Comment, Interaction, Issue, IssueRelation, WakeupRequest

from .wakeups import agent_wakeup, wake_assignee

ISSUE_ASSIGNED = "issue_assigned"
ISSUE_COMMENTED = "issue_commented"
ISSUE_COMMENT_MENTIONED = "issue_comment_mentioned"
ISSUE_BLOCKERS_RESOLVED = "issue_blockers_resolved"
ISSUE_CHILDREN_COMPLETED = "issue_children_completed"
INTERACTION_RESPONDED = "interaction_responded"

# Only people and agents mention: an imported external comment is untrusted text (anyone who can
# comment on the tracker), it wakes the assignee under the connector's own rule and nobody else.
_MENTIONING_AUTHORS = (AuthorType.AGENT, AuthorType.USER)


def _set_key(reason: str, subject_id, member_ids) -> str:
    digest = hashlib.sha256(",".join(sorted(str(i) for i in member_ids)).encode()).hexdigest()[:32]
    return f"{reason}:{subject_id}:{digest}"


def _wake_assignee(issue: Issue, reason: str, idempotency_key: str, context: dict) -> WakeupRequest | None:
    return wake_assignee(issue=issue, source=WakeSource.AUTOMATION, reason=reason, idempotency_key=idempotency_key,
                         context=context)


def issue_became_terminal(issue: Issue) -> None:
    """``issue`` was just saved as done or cancelled, inside that change's transaction.

    Cancelled counts as resolved, a documented choice (upstream versions differ): an abandoned
    blocker no longer holds its dependents, and an abandoned child no longer keeps its parent
    waiting. Dependents are handled before the parent, so a parent blocked on its last child
    (``blockParentUntilDone``) is back in ``todo`` when the children wake is placed, and that
    second wake coalesces into the run the first one queued.
    """
    _release_dependents(issue)
    if issue.parent_id is not None:
        _children_completed(issue.parent_id)


def _release_dependents(blocker: Issue) -> None:
    """Each issue ``blocker`` blocks that has no open blocker left: a ``blocked`` one returns to
    ``todo`` (an audited change by the system); its assignee is woken if the issue is actionable."""
    from .issues import issue_update  # issue_update calls this module on a terminal change

    # Locked in one statement in primary-key order: two finishes releasing the same dependents
    # take the locks in the same order, and whichever locks a dependent second sees the other's
    # committed finish when it counts the open blockers below.
    dependents = list(Issue.objects.select_for_update(of=("self",)).filter(
        incoming_relations__issue=blocker, incoming_relations__kind=RelationKind.BLOCKS,
    ).exclude(status__in=TERMINAL_ISSUE_STATUSES).order_by("pk"))
    for dependent in dependents:
        blockers = list(IssueRelation.objects.filter(related_issue=dependent, kind=RelationKind.BLOCKS)
                        .values_list("issue_id", "issue__status"))
        if any(status not in TERMINAL_ISSUE_STATUSES for _, status in blockers):
            continue
        if dependent.status == IssueStatus.BLOCKED:
            dependent, _, _ = issue_update(actor=SYSTEM, issue=dependent, changes={"status": IssueStatus.TODO})
        blocker_ids = sorted(str(pk) for pk, _ in blockers)
        _wake_assignee(dependent, ISSUE_BLOCKERS_RESOLVED, _set_key(ISSUE_BLOCKERS_RESOLVED, dependent.pk, blocker_ids),
                       {"blockerIssueIds": blocker_ids, "resolvedBlockerId": str(blocker.pk)})


def _children_completed(parent_id) -> None:
    # The parent row lock serialises sibling finishes: the later one sees the earlier one's commit.
    parent = Issue.objects.select_for_update().filter(pk=parent_id).first()
    children = list(Issue.objects.filter(parent_id=parent_id).values_list("pk", "status"))
    if parent is None or any(status not in TERMINAL_ISSUE_STATUSES for _, status in children):
        return
    child_ids = sorted(str(pk) for pk, _ in children)
    _wake_assignee(parent, ISSUE_CHILDREN_COMPLETED, _set_key(ISSUE_CHILDREN_COMPLETED, parent.pk, child_ids),
                   {"childIssueIds": child_ids})


def mentions_wake(comment: Comment, issue: Issue) -> set:
    """Wake every agent of the comment's company that the comment mentions (not its author),
    whoever the issue's assignee is. Returns the ids of the agents a wake was requested for."""
    if comment.author_type not in _MENTIONING_AUTHORS:
        return set()
    tails = mentions.mention_tails(comment.body)  # no '@' outside code: no agent query
    if not tails:
        return set()
    candidates = Agent.objects.filter(company_id=comment.company_id).exclude(pk=comment.author_agent_id).only(
        "pk", "name", "company_id")
    woken = set()
    for agent in mentions.mentioned(tails, candidates):
        agent_wakeup(actor=SYSTEM, agent=agent, source=WakeSource.AUTOMATION, reason=ISSUE_COMMENT_MENTIONED,
                     issue=issue, comment_ids=[comment.pk], idempotency_key=f"{ISSUE_COMMENT_MENTIONED}:{comment.pk}",
                     context={"wakeCommentId": str(comment.pk)}, issue_is_current=True)
        woken.add(agent.pk)
    return woken


def interaction_answered_wake(interaction: Interaction) -> WakeupRequest | None:
    """The board closed an interaction (answered, accepted, rejected, cancelled, or expired on a
    stale accept): the agent that asked is woken on the interaction's issue. Called after the
    answer is committed."""
    if interaction.created_by_agent_id is None:
        return None
    agent = Agent(pk=interaction.created_by_agent_id, company_id=interaction.company_id)
    return agent_wakeup(actor=SYSTEM, agent=agent, source=WakeSource.AUTOMATION, reason=INTERACTION_RESPONDED,
                        issue=Issue(pk=interaction.issue_id),
                        idempotency_key=f"{INTERACTION_RESPONDED}:{interaction.pk}:{interaction.status}",
                        context={"interactionId": str(interaction.pk), "interactionStatus": interaction.status})
