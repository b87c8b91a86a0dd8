"""Harnesses: what actually does a run's turn for the runner (see ``prp_runner.session``).

* ``fake`` (options ``script``: a bundled script name such as ``happy-path``, or a path) plays a
  ``paperclip.fake_harness.script.v1`` script — :mod:`.fake`;
* ``process`` (options ``command``: an argv list) supervises an agent command and maps its output
  to events — :mod:`.process`.

The runner calls ``capabilities(version)`` for hello, ``run(session)`` on its harness thread once
the turn starts (and again after a runner restart, with the last checkpoint), and
``goal_command(command)`` for v2 ``session.goal.*`` commands when the harness advertises goals.
"""
from __future__ import annotations

from typing import Protocol

from .fake import FakeHarness
from .process import ProcessHarness


class Harness(Protocol):
    name: str

    def capabilities(self, version: int) -> dict:
        """The v1 or v2 capability document; advertise only what is supported."""

    def run(self, session) -> int:
        """Do the turn through ``session`` (a ``prp_runner.session.HarnessSession``); blocks until
        the harness ends and returns its exit code."""

    def goal_command(self, command: dict) -> dict | None:
        """The result of a v2 ``session.goal.*`` command; None: unsupported."""


HARNESSES = {"fake": FakeHarness.from_options, "process": ProcessHarness.from_options}


def get_harness(name: str, options: dict) -> Harness:
    """The harness ``name`` built from ``options``. Unknown name: LookupError; unusable options
    (no script, unreadable or invalid script, no command): ValueError or OSError."""
    try:
        factory = HARNESSES[name]
    except KeyError:
        raise LookupError(f"unknown harness {name!r} (known: {', '.join(sorted(HARNESSES))})") from None
    return factory(options)
