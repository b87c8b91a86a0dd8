"""Strict comment commands (§8.2), parsed by deterministic code — never inferred from free text.

Syntax: a line that starts with ``/paperclip`` (no leading text; lines inside fenced code blocks
are ignored), then a verb and its arguments::

    /paperclip assign <agent name>   route the issue to that agent (a checked-out issue gets a
                                     handoff request instead of a forced reassignment)
    /paperclip status                reply with the issue's status, assignee and link state
    /paperclip pause                 pause sync of this link (operator-style pause)
    /paperclip resume                resume sync of this link (a resync follows)

Authorization (instance ``command_policy``):

* ``any_member`` (default): anyone who can comment on the external task, except the connector's
  own service account (whose comments are dropped before parsing);
* ``mapped_users``: only external users named by an enabled ``user_mapping`` routing rule;
* ``disabled``: commands are rejected with a reply.

Every command gets a reply, including rejections (unknown verb, unknown or paused agent, not
permitted), except on a link whose sync mode is ``observer``: there no command has any effect and
none is answered (a reply is a write on one side); the activity log records each as ignored. On an
``external_observer`` link ``assign`` reassigns without waking the agent (services/run_modes.py)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from connectors.providers.base import COMMAND_VERBS

# The one verb list: the same tuple is every adapter's ``Capabilities.command_verbs`` (§8.2 "listed in
# capability metadata"), so the instance API and health show exactly what this parser accepts.
VERBS = COMMAND_VERBS
LINE = re.compile(r"^/paperclip(?:[ \t]+(?P<verb>\S+))?(?P<args>[ \t]+.*)?$")
FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass(frozen=True)
class Command:
    verb: str
    args: tuple[str, ...]
    line: str


def parse_commands(body: str) -> list[Command]:
    commands, fenced = [], False
    for raw in (body or "").splitlines():
        if FENCE.match(raw):
            fenced = not fenced
            continue
        if fenced:
            continue
        line = raw.rstrip()
        match = LINE.match(line)
        if match is None:
            continue
        verb = (match.group("verb") or "").lower()
        args = tuple((match.group("args") or "").split())
        commands.append(Command(verb=verb, args=args, line=line))
    return commands
