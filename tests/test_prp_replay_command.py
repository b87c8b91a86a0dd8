"""``manage.py prp_replay``: golden bytes on stdout, fail-closed refusals with exit 2 and the reason
on stderr, unreadable input as a CommandError (exit 1). No database."""
from __future__ import annotations

import copy
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.test_runner_reducer import GOLDEN_CASES

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "prp"
MEASUREMENT = {"inputTokens": 1, "outputTokens": 1, "cacheReadTokens": 0, "cacheWriteTokens": 0,
               "activeSeconds": 0.5, "requests": 1, "providerCostUsd": None}


def run_command(*args) -> subprocess.CompletedProcess:
    """The real command line: exit code and raw bytes as a shell would see them."""
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    return subprocess.run([sys.executable, "manage.py", "prp_replay", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, timeout=120)


def call(*args) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("prp_replay", *map(str, args), stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.mark.parametrize("name", ["happy-path", "duplicate-event"])
def test_command_stdout_is_byte_identical_to_the_shared_goldens(name):
    fixture = FIXTURES / "phase-01" / f"{name}.json"
    golden = FIXTURES / "phase-01" / "golden"
    snapshot = run_command(fixture)
    assert (snapshot.returncode, snapshot.stderr) == (0, b"")
    assert snapshot.stdout == (golden / f"{name}.snapshot.json").read_bytes()
    summary = run_command(fixture, "--summary")
    assert (summary.returncode, summary.stderr) == (0, b"")
    assert summary.stdout == (golden / f"{name}.summary.json").read_bytes()


@pytest.mark.parametrize("folder,name", GOLDEN_CASES, ids=[f"{d}/{n}" for d, n in GOLDEN_CASES])
def test_command_output_matches_every_golden(folder, name):
    fixture = FIXTURES / folder / f"{name}.json"
    for flag, suffix in (((), "snapshot"), (("--summary",), "summary")):
        out, err = call(fixture, *flag)
        assert err == ""
        assert out.encode("utf-8") == (FIXTURES / folder / "golden" / f"{name}.{suffix}.json").read_bytes()


def refusal(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stdout == b""
    reason = json.loads(result.stderr.decode("utf-8"))
    assert set(reason) == {"error", "code", "details"} and reason["error"]
    return reason


@pytest.mark.parametrize("path", ["phase-01/unsupported-required-version.json",
                                  "upstream-replay/unsupported-required-version.json"])
def test_unsupported_required_version_exits_2_with_the_reason_on_stderr(path):
    reason = refusal(run_command(FIXTURES / path, "--summary"))
    assert reason["code"] == "unsupported_required_version"
    assert reason["details"]["field"] == "$.protocolVersion"
    assert reason["details"]["value"] == 3
    assert reason["details"]["supported"] == [1, 2]


def test_unsupported_semantic_tool_envelope_is_refused():
    reason = refusal(run_command(FIXTURES / "upstream-replay" / "semantic-tool-unsupported-required-version.json"))
    assert reason["code"].startswith("unsupported_required_")
    assert reason["details"]["field"].startswith("$.events[0].payload.semantic_tool.schema")
    assert reason["details"]["value"] in (2, "paperclip.prp.semantic_tool.v2")


def test_closed_object_violation_is_refused_with_its_json_path(tmp_path):
    doc = json.loads((FIXTURES / "phase-01" / "happy-path.json").read_text(encoding="utf-8"))
    usage = copy.deepcopy(doc["events"][0])
    usage.update(sourceEventId="event_usage", sourceSeq=10, eventType="usage.reported",
                 payload={"provider": "openai", "model": None, "cumulative": MEASUREMENT, "runDelta": None,
                          "runDeltaAvailable": False, "token": "sk-should-not-be-here"})
    doc["events"].append(usage)
    path = tmp_path / "closed.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    reason = refusal(run_command(path))
    assert reason["code"] == "schema_invalid"
    assert reason["details"]["field"] == "$.events[9].payload.token"  # usage.schema.json is closed
    with pytest.raises(SystemExit) as exited:  # the same refusal in-process
        call(path)
    assert exited.value.code == 2


def test_unreadable_or_non_json_input_is_a_command_error(tmp_path):
    missing = tmp_path / "missing.json"
    with pytest.raises(CommandError, match="Cannot read"):
        call(missing)
    broken = tmp_path / "broken.json"
    broken.write_bytes(b'{"schema": ')
    with pytest.raises(CommandError, match="is not JSON"):
        call(broken)
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"name": "\xe9"}')
    with pytest.raises(CommandError, match="is not JSON"):
        call(latin)
    result = run_command(broken)
    assert (result.returncode, result.stdout) == (1, b"")
    assert b"CommandError" in result.stderr and b"is not JSON" in result.stderr


def test_a_json_value_that_is_not_a_fixture_is_refused(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]", encoding="utf-8")
    assert refusal(run_command(path))["code"] == "schema_invalid"
