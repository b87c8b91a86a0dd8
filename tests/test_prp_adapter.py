"""The ``prp`` adapter's configuration, the reference runner's command line it builds, and the
external launch: a runner elsewhere attaches with the agent's own key and gets the run's key."""
import sys
import threading

import httpx
import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from issues.adapters import get_adapter
from issues.adapters.base import AdapterConfigError, prepare_context
from issues.adapters.prp import PrpAdapter, bundled_script
from issues.choices import LIVE_RUN_STATUSES, RunStatus
from issues.models import ActivityLog, AgentApiKey, HeartbeatRun, RunnerSession
from issues.models.agent import hash_key
from issues.services.companies import agent_api_key_create
from issues.services.runs import run_finish
from tests.factories import AgentFactory, MembershipFactory, RunFactory
from tests.runner_helpers import hello_body
from tests.test_errors import assert_error

SCRIPTS = ["duplicate-terminal", "error", "happy-path", "interrupted", "linger", "permission-input"]


def test_the_adapter_offers_the_six_bundled_scripts():
    # Their bytes are checked against the fixtures in tests/test_prp_runner_harness.py.
    assert PrpAdapter.script_names() == SCRIPTS
    assert all(bundled_script(name).is_file() for name in SCRIPTS)


@pytest.mark.parametrize("config", [
    {"harness": "fake", "script": "happy-path"},
    {"harness": "process", "command": ["python", "agent.py"], "env": {"MODEL": "m"}, "cwd": "/srv/x",
     "grace_seconds": 2, "drain_timeout_seconds": 30},
    {"launch": "external"},
    {"launch": "local", "harness": "fake", "script": "linger"},
])
def test_valid_configs(config):
    PrpAdapter().validate_config(config)


@pytest.mark.parametrize("config, names", [
    ({}, "harness"),
    ({"harness": "shell", "command": ["x"]}, "harness"),
    ({"harness": "fake"}, "script"),
    ({"harness": "fake", "script": "../../etc/passwd"}, "script"),
    ({"harness": "fake", "script": "/abs/path/happy-path.json"}, "script"),
    ({"harness": "fake", "script": "no-such-script"}, "script"),
    ({"harness": "fake", "script": "happy-path", "command": ["x"]}, "command"),
    ({"harness": "process", "command": "python agent.py"}, "command"),
    ({"harness": "process", "command": []}, "command"),
    ({"harness": "process"}, "command"),
    ({"harness": "process", "command": ["x"], "script": "happy-path"}, "script"),
    ({"harness": "process", "command": ["x"], "cwd": "relative"}, "cwd"),
    ({"harness": "process", "command": ["x"], "env": {"PAPERCLIP_API_KEY": "x"}}, "PAPERCLIP_API_KEY"),
    ({"harness": "process", "command": ["x"], "drain_timeout_seconds": 0}, "drain_timeout_seconds"),
    ({"harness": "process", "command": ["x"], "colour": "red"}, "colour"),
    ({"launch": "orbit"}, "launch"),
    ({"launch": "external", "harness": "fake"}, "harness"),
])
def test_invalid_configs_name_the_field(config, names):
    with pytest.raises(AdapterConfigError) as excinfo:
        PrpAdapter().validate_config(config)
    assert names in str(excinfo.value)


def test_the_runner_command_line_wraps_the_harness():
    fake = PrpAdapter._runner_config({"harness": "fake", "script": "happy-path", "grace_seconds": 3}, outbox="/o.db")
    assert fake["command"][:3] == [sys.executable, "-m", "prp_runner"]
    assert fake["command"][3:] == ["--outbox", "/o.db", "--drain-timeout", "600", "--harness", "fake",
                                   "--script", str(bundled_script("happy-path"))]
    assert fake["grace_seconds"] == 3 and fake["env"] == {}
    process = PrpAdapter._runner_config({"harness": "process", "command": ["python", "a.py", "--x"],
                                         "env": {"M": "1"}, "drain_timeout_seconds": 12.5}, outbox="/o.db")
    assert process["command"][3:] == ["--outbox", "/o.db", "--drain-timeout", "12.5", "--harness", "process",
                                      "--", "python", "a.py", "--x"]
    assert process["env"] == {"M": "1"}


@pytest.mark.django_db
def test_agent_api_refuses_a_bad_prp_config_with_the_field():
    agent = AgentFactory()
    client = APIClient()
    client.force_login(MembershipFactory(company=agent.company, role="owner").user)
    response = client.post(f"/api/companies/{agent.company_id}/agents",
                           {"name": "Runner", "adapterType": "prp", "adapterConfig": {"harness": "fake",
                                                                                       "script": "/etc/passwd"}},
                           format="json")
    body = assert_error(response, 400)
    assert "script" in str(body["details"])


# --- external launch --------------------------------------------------------------------------

def external_run(agent=None, status=RunStatus.RUNNING):
    agent = agent or AgentFactory(adapter_type="prp", adapter_config={"launch": "external"})
    ended = {"finished_at": timezone.now()} if status not in LIVE_RUN_STATUSES else {}
    return RunFactory(agent=agent, company=agent.company, status=status, adapter_type="prp", **ended)


def agent_client(agent) -> tuple[APIClient, str]:
    _key, raw = agent_api_key_create(agent=agent, name="runner host")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client, raw


@pytest.mark.django_db
def test_external_launch_starts_nothing_and_waits():
    run = external_run(status=RunStatus.QUEUED)
    HeartbeatRun.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    run.refresh_from_db()
    ctx = prepare_context(run, owner="w:1", api_url="http://127.0.0.1:9/api")
    assert get_adapter("prp").execute(ctx) is None  # the run stays live for the attaching runner
    assert run.events.filter(message__contains="waiting for an external runner").exists()
    assert HeartbeatRun.objects.get(pk=run.pk).status == RunStatus.RUNNING


@pytest.mark.django_db
def test_attach_hands_out_the_oldest_waiting_run_once(settings):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "API_URL": "http://127.0.0.1:8000/api"}
    first = external_run()
    second = external_run(agent=first.agent)
    client, _ = agent_client(first.agent)
    response = client.post("/api/runner/v1/attach")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["runId"] == str(first.pk)
    assert body["runnerUrl"] == f"http://127.0.0.1:8000/api/runner/v1/runs/{first.pk}/"
    assert body["env"]["PAPERCLIP_RUN_ID"] == str(first.pk) and body["env"]["PAPERCLIP_API_KEY"] == body["apiKey"]
    assert body["env"]["PAPERCLIP_RUNNER_URL"] == body["runnerUrl"]
    key = AgentApiKey.objects.get(key_hash=hash_key(body["apiKey"]))
    assert key.run_id == first.pk and key.agent_id == first.agent_id
    assert ActivityLog.objects.filter(action="run.runner_attached", entity_id=str(first.pk)).count() == 1
    # The key it got drives that run over the runner API.
    runner = APIClient()
    runner.credentials(HTTP_AUTHORIZATION=f"Bearer {body['apiKey']}")
    hello = runner.post(f"/api/runner/v1/runs/{first.pk}/hello", hello_body(), format="json")
    assert hello.status_code == 200, hello.content
    assert client.post("/api/runner/v1/attach").json()["runId"] == str(second.pk)
    assert client.post("/api/runner/v1/attach").status_code == 204  # nothing else waits
    # The run's key dies with the run.
    run_finish(run=HeartbeatRun.objects.get(pk=first.pk), status=RunStatus.SUCCEEDED)
    key.refresh_from_db()
    assert key.revoked_at is not None


@pytest.mark.django_db
def test_attach_offers_only_this_agents_running_external_runs():
    agent = AgentFactory(adapter_type="prp", adapter_config={"launch": "external"})
    external_run(agent=agent, status=RunStatus.QUEUED)  # not started by the host yet
    external_run(agent=agent, status=RunStatus.SUCCEEDED)
    external_run()  # another agent's (another company's) run
    local = AgentFactory(company=agent.company, adapter_type="prp",
                         adapter_config={"harness": "fake", "script": "happy-path"})
    RunFactory(agent=local, company=agent.company, status=RunStatus.RUNNING, adapter_type="prp")
    client, _ = agent_client(agent)
    assert client.post("/api/runner/v1/attach").status_code == 204
    local_client, _ = agent_client(local)
    assert local_client.post("/api/runner/v1/attach").status_code == 204  # a local run has its own runner
    assert not RunnerSession.objects.exists()


@pytest.mark.django_db
def test_attach_needs_the_agents_long_lived_key():
    run = external_run()
    assert_error(APIClient().post("/api/runner/v1/attach"), 401)
    run_key_client = APIClient()
    from issues.adapters.base import issue_run_key

    run_key_client.credentials(HTTP_AUTHORIZATION=f"Bearer {issue_run_key(run)}")
    assert_error(run_key_client.post("/api/runner/v1/attach"), 403, "agent_key_required")
    board = APIClient()
    board.force_login(MembershipFactory(company=run.company, role="owner").user)
    assert board.post("/api/runner/v1/attach").status_code in (401, 403)
    assert not RunnerSession.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_concurrent_attaches_never_share_a_run(live_server):
    agent = AgentFactory(adapter_type="prp", adapter_config={"launch": "external"})
    runs = {str(external_run(agent=agent).pk) for _ in range(3)}
    _, raw = agent_client(agent)
    barrier, answers = threading.Barrier(6), []

    def attach():
        with httpx.Client(base_url=live_server.url, headers={"Authorization": f"Bearer {raw}"}, timeout=30) as c:
            barrier.wait()
            answers.append(c.post("/api/runner/v1/attach"))

    threads = [threading.Thread(target=attach) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    claimed = [r.json()["runId"] for r in answers if r.status_code == 200]
    assert sorted(claimed) == sorted(runs)  # each run exactly once
    assert sorted(r.status_code for r in answers) == [200, 200, 200, 204, 204, 204]
