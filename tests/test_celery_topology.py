"""The scheduler in the production topology: real ``celery worker`` and ``celery beat`` processes
against Redis and the test's own database. A wake recorded over the API is dispatched by beat's
sweep to a worker that runs a real agent process; when the worker owning a run is SIGKILLed, the
surviving worker's sweep abandons the run and no stale lock is left behind.

Nothing in the test process dispatches or executes runs: it records wakes, watches the database
(bounded polling), and kills processes. Needs Redis on 127.0.0.1:6379 (CI starts it)."""
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import pytest
from django.conf import settings as django_settings
from django.db import connection
from rest_framework.test import APIClient

from issues.actors import Actor
from issues.models import Comment, HeartbeatRun
from issues.services.checkout import issue_checkout
from tests.factories import AgentFactory, IssueFactory, MembershipFactory

BASE_DIR = Path(__file__).resolve().parent.parent
AGENT = str(BASE_DIR / "examples" / "heartbeat_agent.py")
CELERY = str(Path(sys.executable).parent / "celery")
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
REDIS_DBS = range(9, 16)  # kept away from the low indexes a developer's own setup may use
REDIS_CLAIM_KEY = "paperclip-test-topology-claim"
TERMINAL = ("succeeded", "failed", "cancelled", "timed_out", "interrupted")


# --- helpers ----------------------------------------------------------------------------------
def wait_for(condition, *, timeout, what, logs=None, interval=0.2):
    """Poll ``condition`` until it returns something truthy; fail with the Celery logs at ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}" + (logs() if logs else ""))
        time.sleep(interval)


def database_url() -> str:
    """The URL of the very database this test uses (the test database, not the configured one)."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{os.path.abspath(s['NAME'])}"  # sqlite:////abs/path
    assert connection.vendor == "postgresql", connection.vendor
    auth = quote(s["USER"] or "", safe="")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"], safe="")
    host = s.get("HOST") or "127.0.0.1"
    port = f":{s['PORT']}" if s.get("PORT") else ""
    return f"postgres://{auth}@{host}{port}/{quote(s['NAME'], safe='')}"


@contextmanager
def redis_database():
    """A Redis database index of its own for this test: claimed with SET NX (so parallel test runs
    on one machine never share a broker), emptied before and after."""
    import redis

    token = uuid.uuid4().hex
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    preferred = REDIS_DBS[int(worker[2:]) % len(REDIS_DBS)] if worker[2:].isdigit() else REDIS_DBS[0]
    candidates = [preferred] + [i for i in REDIS_DBS if i != preferred]
    try:
        redis.Redis(host=REDIS_HOST, port=REDIS_PORT, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        message = f"Redis is required at {REDIS_HOST}:{REDIS_PORT} for the Celery topology tests: {exc}"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI starts Redis: its absence there is a failure, never a skip
        pytest.skip(message + " (a developer machine without Redis; CI runs these)")
    for index in candidates:
        client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=index)
        if client.set(REDIS_CLAIM_KEY, token, nx=True, ex=600):
            break
    else:
        pytest.fail(f"no free Redis database among {list(REDIS_DBS)} (all claimed by other test runs)")

    def empty():
        for key in client.scan_iter(count=500):
            if key != REDIS_CLAIM_KEY.encode():
                client.delete(key)

    try:
        empty()  # leftovers of a crashed earlier run
        yield index
    finally:
        empty()
        if client.get(REDIS_CLAIM_KEY) == token.encode():
            client.delete(REDIS_CLAIM_KEY)
        client.close()


def is_example_agent(pid: int) -> bool:
    """Guards against pid reuse before a cleanup kill."""
    try:
        return AGENT.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def kill_agent(pid: int | None):
    if pid and is_example_agent(pid):
        try:
            os.killpg(pid, signal.SIGKILL)  # start_new_session: the agent leads its own group
        except (ProcessLookupError, PermissionError):
            pass


class Topology:
    """Celery workers and beat, started as real subprocesses in their own sessions."""

    def __init__(self, env: dict, tmp_path: Path):
        self.env, self.tmp_path, self.procs, self.logs = env, tmp_path, {}, {}

    def _start(self, name, args):
        log = self.tmp_path / f"celery-{name}.log"
        self.logs[name] = log
        with open(log, "wb") as out:
            self.procs[name] = subprocess.Popen(
                [CELERY, "-A", "paperclip", *args], cwd=BASE_DIR, env=self.env, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return self.procs[name]

    def worker(self, name, *, pool="threads", concurrency=2):
        return self._start(name, [
            "worker", f"--pool={pool}", f"--concurrency={concurrency}", "--loglevel=INFO",
            "-n", f"topology-{name}-{uuid.uuid4().hex[:8]}@%h",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ])

    def beat(self):
        return self._start("beat", ["beat", "--loglevel=INFO", "--schedule", str(self.tmp_path / "beat-schedule"),
                                    "--pidfile="])

    def owner(self, name) -> str:
        return f"{socket.gethostname()}:{self.procs[name].pid}"

    def wait_ready(self, *names, timeout=30):
        def ready():
            for name in names:
                if self.procs[name].poll() is not None:
                    pytest.fail(f"celery {name} exited with {self.procs[name].returncode}" + self.dump())
            return all(b" ready." in self.logs[name].read_bytes() for name in names)

        wait_for(ready, timeout=timeout, what=f"celery {', '.join(names)} to be ready", logs=self.dump)

    def kill(self, name):
        """SIGKILL the process group, as an OOM kill or a lost machine would."""
        proc = self.procs[name]
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)

    def stop_all(self):
        for name in list(self.procs):
            self.kill(name)

    def dump(self) -> str:
        parts = []
        for name, log in self.logs.items():
            text = log.read_text(errors="replace") if log.exists() else ""
            parts.append(f"\n--- celery {name} (last 4000 chars) ---\n{text[-4000:]}")
        return "".join(parts)


# --- fixtures ---------------------------------------------------------------------------------
@pytest.fixture
def topology(transactional_db, live_server, settings, tmp_path):
    """Yields a Topology whose processes share this test's database and a private Redis database;
    none of them outlives the test, nor does any agent process a run of this test started."""
    # Nothing in this process may dispatch: a wake only records a queued run.
    settings.PAPERCLIP = {**settings.PAPERCLIP, "KICK_ON_COMMIT": False}
    with redis_database() as redis_db:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", django_settings.SETTINGS_MODULE),
            "DATABASE_URL": database_url(),
            "CELERY_BROKER_URL": f"redis://{REDIS_HOST}:{REDIS_PORT}/{redis_db}",
            "CELERY_TASK_ALWAYS_EAGER": "false",
            "PAPERCLIP_SWEEP_SECONDS": "1",
            "PAPERCLIP_RUN_HEARTBEAT_INTERVAL_SECONDS": "1",
            "PAPERCLIP_RUN_HEARTBEAT_STALE_SECONDS": "4",
            "PAPERCLIP_API_URL": f"{live_server.url}/api",
            "PAPERCLIP_WORKSPACE_ROOT": str(tmp_path / "workspaces"),
            "LOG_LEVEL": "INFO",
        }
        topo = Topology(env, tmp_path)
        try:
            yield topo
        finally:
            topo.stop_all()  # before the database is flushed and the Redis database emptied
            for pid in HeartbeatRun.objects.filter(pid__isnull=False).values_list("pid", flat=True):
                kill_agent(pid)  # agents run in their own sessions: orphans survive their worker


def make_agent(company, mode="done", **env):
    return AgentFactory(company=company, adapter_type="process", adapter_config={
        "command": [sys.executable, AGENT], "env": {"EXAMPLE_AGENT_MODE": mode, **env},
    })


def board(company):
    client = APIClient()
    client.force_login(MembershipFactory(company=company).user)
    return client


def wake(company, agent, issue):
    response = board(company).post(f"/api/agents/{agent.pk}/wakeup", {"issueId": str(issue.pk), "reason": "assigned"},
                                   format="json")
    assert response.status_code == 201, response.content
    assert response.json()["run"]["status"] == "queued"
    return HeartbeatRun.objects.get(pk=response.json()["run"]["id"])


def agent_key_status(key: str) -> int:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client.get("/api/agents/me").status_code


def run_key_from_process(pid: int) -> str | None:
    """The run-scoped key the host handed the agent (its environment, as the agent sees it)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"PAPERCLIP_API_KEY="):
            return item.split(b"=", 1)[1].decode()
    return None


# --- tests ------------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_beat_and_worker_dispatch_a_wake_to_a_real_agent(topology, company):
    agent = make_agent(company)
    issue = IssueFactory(company=company, assignee_agent=agent, title="Say hello")
    run = wake(company, agent, issue)

    topology.worker("w")
    topology.beat()
    # beat's sweep -> dispatch_runs -> execute_run, all on the worker; the agent calls the live server.
    wait_for(lambda: HeartbeatRun.objects.filter(pk=run.pk, status__in=TERMINAL).exists(), timeout=60,
             what="the worker to run the agent", logs=topology.dump)

    run.refresh_from_db()
    issue.refresh_from_db()
    assert run.status == "succeeded" and run.liveness == "completed", (run.error, topology.dump())
    assert run.owner == topology.owner("w")  # executed by the worker process, not by this one
    assert run.pid and run.exit_code == 0
    assert issue.status == "done"
    assert Comment.objects.filter(issue=issue, author_agent=agent, run=run).exists()
    assert (issue.checkout_run_id, issue.execution_run_id, issue.execution_locked_at) == (None, None, None)
    assert run.api_keys.exists() and not run.api_keys.filter(revoked_at__isnull=True).exists()


@pytest.mark.django_db(transaction=True)
def test_killed_worker_leaves_no_stale_lock_once_its_run_is_abandoned(topology, company):
    agent = make_agent(company, mode="sleep", EXAMPLE_AGENT_SLEEP="120")
    issue = IssueFactory(company=company, assignee_agent=agent, title="Work for a long time")
    run = wake(company, agent, issue)

    topology.worker("a")
    topology.worker("b")
    topology.beat()
    topology.wait_ready("a", "b")
    run = wait_for(lambda: HeartbeatRun.objects.filter(pk=run.pk, status="running", pid__isnull=False).first(),
                   timeout=60, what="the agent process to start", logs=topology.dump)

    # The sleep-mode example agent never checks out by itself: claim the issue for its run, as
    # its first API call would, so that the run holds the issue's lock.
    _, claimed = issue_checkout(actor=Actor(agent=agent, run_header=str(run.pk)), issue=issue, agent_id=agent.pk,
                                expected_statuses=["todo"], run_header=str(run.pk))
    assert claimed
    issue.refresh_from_db()
    assert issue.checkout_run_id == run.pk and issue.execution_run_id == run.pk and issue.execution_locked_at

    key = run_key_from_process(run.pid)  # None only where there is no /proc
    assert key or not os.path.isdir("/proc/self")
    if key:
        assert agent_key_status(key) == 200

    host, _, owner_pid = run.owner.rpartition(":")
    owners = {topology.owner(name): name for name in ("a", "b")}
    assert run.owner in owners, (run.owner, owners)
    doomed = owners[run.owner]
    survivor = "b" if doomed == "a" else "a"
    assert host == socket.gethostname() and int(owner_pid) == topology.procs[doomed].pid
    topology.kill(doomed)  # the agent lives on in its own session: an orphan no host supervises

    # The survivor's sweep sees the heartbeat go stale (4 s) and abandons the run.
    wait_for(lambda: HeartbeatRun.objects.filter(pk=run.pk, status__in=TERMINAL).exists(), timeout=40,
             what="the surviving worker to reap the stale run", logs=topology.dump)
    assert topology.procs[survivor].poll() is None

    run.refresh_from_db()
    issue.refresh_from_db()
    assert run.status == "timed_out" and run.error.startswith("heartbeat stale"), run.error
    assert run.owner == f"{host}:{owner_pid}"  # the dead worker's run: nobody else may kill its process
    assert (issue.checkout_run_id, issue.execution_run_id, issue.execution_locked_at) == (None, None, None)
    assert issue.status == "in_progress"  # the work is not lost: it is retried
    # The retry is scheduled right after the reaping transaction commits: wait for it, do not race it.
    retry = wait_for(lambda: HeartbeatRun.objects.filter(agent=agent, issue=issue, retry_attempt=1).first(),
                     timeout=20, what="the retry of the abandoned run", logs=topology.dump)
    assert retry.status == "scheduled_retry" and retry.source_run_id == run.pk, retry.status
    assert retry.scheduled_for > run.finished_at  # after backoff (RUN_RETRY_BASE_SECONDS)
    assert run.api_keys.exists() and not run.api_keys.filter(revoked_at__isnull=True).exists()
    if key:
        assert agent_key_status(key) == 401  # the orphan can no longer act
