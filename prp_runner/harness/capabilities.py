"""The capability document a harness advertises in hello (``paperclip.prp.capabilities.v1|v2``).

A harness says only what it supports: each flag is its own, ``unsupported`` names the flags it
lacks, and on v2 ``sessionGoals`` (mandatory there) says ``unsupported`` with no actions — neither
bundled harness keeps a session goal.
"""
from __future__ import annotations

from .. import RUNNER_VERSION

CAPABILITIES_SCHEMAS = {1: "paperclip.prp.capabilities.v1", 2: "paperclip.prp.capabilities.v2"}
FLAGS = ("steer", "interrupt", "resume", "runtimeRequests", "structuredResult", "typedEvents")


def capability_doc(version: int, *, driver: str, **flags: bool) -> dict:
    """The document for PRP ``version`` (1 or 2); ``flags`` gives every one of :data:`FLAGS`."""
    if set(flags) != set(FLAGS):
        raise TypeError(f"capability flags must be exactly {', '.join(FLAGS)}")
    doc = {"schema": CAPABILITIES_SCHEMAS[version], "sessionReusePolicy": "new_per_run",
           "driver": {"kind": driver, "version": RUNNER_VERSION}, **flags,
           "unsupported": [name for name in FLAGS if not flags[name]]}
    if version >= 2:
        doc["sessionGoals"] = {"availability": "unsupported", "actions": [], "autonomousUpdates": False,
                               "persistentAcrossResume": False, "maxObjectiveChars": 4000,
                               "tokenBudgetControl": False, "usageReporting": False,
                               "reasonCode": "harness_has_no_session_goals"}
    return doc
