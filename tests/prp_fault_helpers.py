"""Real processes for the reference runner's fault tests (issue #18): the host's web process
(``manage.py runserver`` on this test's database, SIGKILLable and restartable on the same port), a
loopback HTTP proxy between runner and host that can take the network down or kill the web process
between its commit and its answer, the runner itself (``python -m prp_runner``) and fake-harness
scripts written for the test.

    rig = FaultRig(tmp_path)                     # web process started, proxy in front of it
    runner = rig.runner(run, key, write_script(tmp_path, "stream", steps))
    runner.start(); runner.kill(); runner.start(); assert runner.wait(timeout=120) == 0
    rig.proxy.arm_kill(rig.server.kill)          # the next committed batch is never answered
    rig.proxy.outage_after(predicate, seconds=4) # refuse connections for a while after an answer
"""
from __future__ import annotations

import copy
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from issues.adapters.base import issue_run_key
from issues.models import RunEvent, RunnerEvent, RunnerSource
from tests.factories import AgentFactory, RunFactory
from tests.test_celery_topology import database_url, wait_for

BASE_DIR = Path(__file__).resolve().parent.parent
SCRIPT_SCHEMA = "paperclip.fake_harness.script.v1"
_HAPPY_PATH = Path(__file__).with_name("fixtures") / "prp" / "phase-02" / "scripts" / "happy-path.json"
_LOG_TAIL = 6000


def prp_run():
    """A running run of a ``prp`` agent whose runner is started elsewhere (here: by the test), and
    the run-scoped key that runner drives it with."""
    agent = AgentFactory(adapter_type="prp", adapter_config={"launch": "external"})
    run = RunFactory(agent=agent, company=agent.company, status="running", adapter_type="prp")
    return run, issue_run_key(run)


# --- fake-harness scripts ---------------------------------------------------------------------

def item_stream(count: int, *, delay_ms: int = 0, item_id: str = "item_stream", lead_ms: int = 0) -> list[dict]:
    """``item.started``, ``count`` numbered ``item.delta`` events (``delay_ms`` apart), ``item.completed``;
    ``lead_ms`` waits between the start and the first delta."""
    steps = [{"kind": "event", "event_type": "item.started", "item_id": item_id,
              "payload": {"kind": "assistant_message", "text": ""}}]
    if lead_ms:
        steps.append({"kind": "delay", "milliseconds": lead_ms})
    for i in range(count):
        if i and delay_ms:
            steps.append({"kind": "delay", "milliseconds": delay_ms})
        steps.append({"kind": "event", "event_type": "item.delta", "item_id": item_id,
                      "payload": {"text": f"chunk {i:04d} "}})
    steps.append({"kind": "event", "event_type": "item.completed", "item_id": item_id,
                  "payload": {"kind": "assistant_message", "text": f"{count} chunks"}})
    return steps


def finish_steps() -> list[dict]:
    """The happy path's ending: its proposed result (done), its succeeded terminal, exit 0."""
    steps = json.loads(_HAPPY_PATH.read_text())["steps"]
    picked = [copy.deepcopy(s) for s in steps if s["kind"] in ("result", "terminal")]
    return picked + [{"kind": "exit", "code": 0}]


def write_script(folder: Path, name: str, steps: list[dict]) -> Path:
    path = Path(folder) / f"{name}.json"
    path.write_text(json.dumps({"schema": SCRIPT_SCHEMA, "name": name, "steps": steps}, indent=1))
    return path


def step_payload(steps: list[dict], kind: str) -> dict:
    return next(s["payload"] for s in steps if s["kind"] == kind)


def item_events(steps: list[dict]) -> list[tuple]:
    """(eventType, itemId, payload) of the script's item events, in script order."""
    return [(s["event_type"], s.get("item_id"), s["payload"]) for s in steps
            if s["kind"] == "event" and s["event_type"].startswith("item.")]


# --- what the host committed ------------------------------------------------------------------

def host_rows(run) -> list[RunnerEvent]:
    return list(RunnerEvent.objects.filter(run=run).order_by("position"))


def acked_seq(run) -> int:
    return max(RunnerSource.objects.filter(run=run).values_list("acked_seq", flat=True), default=0)


def emitted_at(row: RunnerEvent) -> float:
    """The envelope's ``emittedAt`` (when the runner stored it in its outbox) as a Unix time."""
    return datetime.fromisoformat(row.envelope["emittedAt"].replace("Z", "+00:00")).timestamp()


def assert_one_ordered_stream(run) -> list[RunnerEvent]:
    """One source, sourceSeq 1..N in commit order, unique ids, and one run-log line per event."""
    rows = host_rows(run)
    assert rows, "the host committed no event"
    assert {r.source_key for r in rows} == {rows[0].source_key}, "more than one source: the runner changed identity"
    assert [r.source_seq for r in rows] == list(range(1, len(rows) + 1))
    ids = [r.source_event_id for r in rows]
    assert len(set(ids)) == len(ids)
    assert acked_seq(run) == len(rows)
    log = list(RunEvent.objects.filter(run=run, kind="runner").order_by("seq")
               .values_list("data__sourceEventId", flat=True))
    assert log == ids, "the run log has not exactly one line per committed event"
    return rows


def assert_script_delivered_once(run, steps: list[dict]) -> list[RunnerEvent]:
    """Every event the script emits reached the host exactly once, in script order."""
    rows = assert_one_ordered_stream(run)
    got = [(r.event_type, r.envelope.get("itemId"), r.envelope["payload"]) for r in rows
           if r.event_type.startswith("item.")]
    expected = item_events(steps)
    assert len(got) == len(expected), (len(got), len(expected))
    assert got == expected
    results = [r for r in rows if r.event_type == "run.result.proposed"]
    terminals = [r for r in rows if r.event_type == "run.terminal"]
    assert [r.envelope["payload"] for r in results] == [step_payload(steps, "result")]
    assert [r.envelope["payload"] for r in terminals] == [step_payload(steps, "terminal")]
    last_item = max(r.position for r in rows if r.event_type.startswith("item."))
    assert last_item < results[0].position < terminals[0].position
    return rows


# --- the host's web process ---------------------------------------------------------------------

def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return probe.getsockname()[1]


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-_LOG_TAIL:] if path.exists() else "(no log)"


class HostServer:
    """``manage.py runserver`` (threaded, no reloader) on 127.0.0.1:<port> against this test's
    database, in a session of its own; each start logs to ``server-<n>.log``."""

    def __init__(self, tmp_path: Path, *, port: int | None = None):
        self.tmp_path, self.port = Path(tmp_path), port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.logs: list[Path] = []
        drop = ("CELERY_BROKER_URL", "CELERY_TASK_ALWAYS_EAGER")
        self.env = {k: v for k, v in os.environ.items() if k not in drop}
        self.env.update({"DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1", "LOG_LEVEL": "WARNING"})

    def start(self):
        log = self.tmp_path / f"server-{len(self.logs) + 1}.log"
        self.logs.append(log)
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "runserver", "--noreload", "--skip-checks", f"127.0.0.1:{self.port}"],
                cwd=BASE_DIR, env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        wait_for(self._answers, timeout=60, what=f"the web process to answer on {self.url}", logs=self.dump)

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"the web process exited with {self.proc.returncode}" + self.dump())
        try:
            httpx.get(f"{self.url}/api/runner/v1/attach", timeout=2)  # any answer: it serves requests
        except httpx.TransportError:
            return False
        return True

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        """SIGKILL the whole process group, as an OOM kill or a lost machine would."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=10)

    def dump(self) -> str:
        return "".join(f"\n--- {log.name} ---\n{_tail(log)}" for log in self.logs)


# --- the loopback proxy ---------------------------------------------------------------------------

@dataclass
class Exchange:
    """One request the proxy relayed and the host's answer to it."""
    method: str
    path: str
    request: dict | None
    status: int
    body: dict | None
    at: float = field(default_factory=time.time)

    @property
    def is_events(self) -> bool:
        return self.method == "POST" and self.path.endswith("/events")

    @property
    def event_ids(self) -> list[str]:
        return [e["sourceEventId"] for e in (self.request or {}).get("events", [])]

    @property
    def first_seq(self) -> int | None:
        events = (self.request or {}).get("events") or []
        return events[0]["sourceSeq"] if events else None


@dataclass
class Outage:
    down_at: float
    acked_before: int  # the last ackedSourceSeq the runner was given before the link went down
    up_at: float | None = None


class _Stream:
    """Buffered reads from one socket."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buf = sock, b""

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buf += chunk
        return bool(chunk)

    def until(self, marker: bytes) -> bytes | None:
        while marker not in self.buf:
            if not self._fill():
                return None
        head, _, self.buf = self.buf.partition(marker)
        return head + marker

    def take(self, n: int) -> bytes | None:
        while len(self.buf) < n:
            if not self._fill():
                return None
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def rest(self) -> bytes:
        while self._fill():
            pass
        out, self.buf = self.buf, b""
        return out


def _read_message(stream: _Stream, *, response: bool = False) -> tuple[bytes, bytes] | None:
    """(head, body) of one HTTP/1.1 message, or None when the peer closed first. Bodies are
    Content-Length framed (httpx sends JSON that way, Django answers that way); an answer without
    one runs to the end of the connection."""
    head = stream.until(b"\r\n\r\n")
    if head is None:
        return None
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    if "content-length" in headers:
        body = stream.take(int(headers["content-length"]))
        if body is None:
            return None
    elif response and not lines[0].split(" ")[1].startswith(("1", "204", "304")):
        body = stream.rest()
    else:
        body = b""
    return head, body


def _json(body: bytes):
    try:
        return json.loads(body) if body else None
    except ValueError:
        return None


class FaultProxy:
    """An HTTP relay on 127.0.0.1 in front of the host, one request at a time per connection
    (httpx does not pipeline). It records every exchange it passed on (``delivered``: what the
    runner was told), and can

    * take the network down (``down``/``up``, or ``outage_after``): the listening socket is closed,
      so connecting is refused, and open connections are cut; it comes back on the same port;
    * kill the host between commit and answer (``arm_kill``): the next events batch the host
      answered with ``accepted > 0`` is not passed on; the callback (SIGKILL of the web process)
      runs first, and the client's connection is closed without a byte of the answer.
    """

    def __init__(self, upstream_port: int):
        self.target = ("127.0.0.1", upstream_port)
        listener = socket.create_server(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.delivered: list[Exchange] = []
        self.outages: list[Outage] = []
        self.refused = 0  # connections the proxy could not open to the host (it was down)
        self.swallowed: Exchange | None = None
        self.tripped = threading.Event()
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._kill = None
        self._events_in_flight = 0
        self._outage = None
        self._closed = False
        self._up, self._listening, self._stopped_listening = threading.Event(), threading.Event(), threading.Event()
        self._up.set()
        self._thread = threading.Thread(target=self._serve, args=(listener,), daemon=True)
        self._thread.start()
        self._listening.wait(10)

    # --- control -----------------------------------------------------------------------------
    def arm_kill(self, kill):
        with self._lock:
            self._kill = kill

    def outage_after(self, predicate, *, seconds: float):
        """After passing on the first answer ``predicate(exchange)`` accepts, go down for
        ``seconds`` (the fault's duration), then come back."""
        with self._lock:
            self._outage = (predicate, seconds)

    def down(self):
        with self._lock:
            acked = next((x.body["ackedSourceSeq"] for x in reversed(self.delivered)
                          if x.is_events and x.status == 200), 0)
            self.outages.append(Outage(down_at=time.time(), acked_before=acked))
            self._stopped_listening.clear()
            self._up.clear()
            socks = list(self._socks)
        self._stopped_listening.wait(10)
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def up(self):
        self.outages[-1].up_at = time.time()
        self._listening.clear()
        self._up.set()
        self._listening.wait(10)

    def close(self):
        self._closed = True
        self._up.set()
        for sock in list(self._socks):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=10)

    def events_in_flight(self) -> int:
        """Events requests forwarded whose answer was not passed on (or dropped) yet."""
        with self._lock:
            return self._events_in_flight

    def acks_seen(self) -> list[int]:
        """Every cursor the runner was given, in order: hello ``sources`` and events ``ackedSourceSeq``."""
        seen = []
        with self._lock:
            for x in self.delivered:
                if x.status != 200 or not isinstance(x.body, dict):
                    continue
                if x.path.endswith("/hello"):
                    seen.extend(x.body.get("sources", {}).values())
                elif x.is_events:
                    seen.append(x.body["ackedSourceSeq"])
        return seen

    def events_exchanges(self, start: int = 0) -> list[Exchange]:
        with self._lock:
            return [x for x in self.delivered[start:] if x.is_events]

    def dump(self) -> str:
        with self._lock:
            tail = self.delivered[-12:]
        lines = [f"{x.method} {x.path} -> {x.status} {json.dumps(x.body)[:200] if x.body else ''}" for x in tail]
        return (f"\n--- proxy: {len(self.delivered)} answers passed on, {self.refused} refused upstream, "
                f"outages {self.outages}, tripped {self.tripped.is_set()} ---\n" + "\n".join(lines))

    # --- serving -----------------------------------------------------------------------------
    def _serve(self, listener: socket.socket):
        while True:
            listener.settimeout(0.05)
            self._listening.set()
            with listener:
                while self._up.is_set() and not self._closed:
                    try:
                        conn, _ = listener.accept()
                    except TimeoutError:
                        continue
                    conn.settimeout(None)
                    threading.Thread(target=self._relay, args=(conn,), daemon=True).start()
            self._stopped_listening.set()
            self._up.wait()
            if self._closed:
                return
            listener = socket.create_server(("127.0.0.1", self.port))  # SO_REUSEADDR: the same port again

    def _track(self, *socks, add=True):
        with self._lock:
            for sock in socks:
                (self._socks.add if add else self._socks.discard)(sock)

    def _relay(self, client: socket.socket):
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            with self._lock:
                self.refused += 1
            client.close()
            return
        upstream.settimeout(None)
        self._track(client, upstream)
        try:
            inbound, outbound = _Stream(client), _Stream(upstream)
            while True:
                request = _read_message(inbound)
                if request is None:
                    return
                events = request[0].startswith(b"POST ") and request[0].split(b" ")[1].endswith(b"/events")
                self._count_in_flight(events, 1)
                try:
                    upstream.sendall(request[0] + request[1])
                    answer = _read_message(outbound, response=True)
                    if answer is None:
                        return  # the host died before answering: the client sees its connection close
                    exchange = self._exchange(request, answer)
                    if self._swallow(exchange):
                        return
                    client.sendall(answer[0] + answer[1])
                    with self._lock:
                        self.delivered.append(exchange)
                finally:
                    self._count_in_flight(events, -1)
                self._maybe_go_down(exchange)
                if b"connection: close" in answer[0].lower():
                    return
        except OSError:
            return
        finally:
            self._track(client, upstream, add=False)
            client.close()
            upstream.close()

    def _count_in_flight(self, events: bool, delta: int):
        if events:
            with self._lock:
                self._events_in_flight += delta

    @staticmethod
    def _exchange(request, answer) -> Exchange:
        method, path = request[0].decode("latin-1").split(" ")[:2]
        status = int(answer[0].split(b" ")[1])
        return Exchange(method=method, path=path.split("?")[0], request=_json(request[1]), status=status,
                        body=_json(answer[1]))

    def _swallow(self, exchange: Exchange) -> bool:
        with self._lock:
            committed = exchange.is_events and exchange.status == 200 and (exchange.body or {}).get("accepted")
            kill, self._kill = (self._kill, None) if committed and self._kill else (None, self._kill)
        if kill is None:
            return False
        kill()  # the web process dies with the batch committed and its answer unsent
        self.swallowed = exchange
        self.tripped.set()
        return True

    def _maybe_go_down(self, exchange: Exchange):
        with self._lock:
            outage, fire = self._outage, self._outage is not None and self._outage[0](exchange)
            if fire:
                self._outage = None
        if fire:
            threading.Thread(target=self._outage_for, args=(outage[1],), daemon=True).start()

    def _outage_for(self, seconds: float):
        self.down()
        time.sleep(seconds)  # the network is down this long: the fault itself, not a wait for a condition
        self.up()


# --- the runner -----------------------------------------------------------------------------------

class RunnerProcess:
    """``python -m prp_runner … --harness fake --script <path>`` for one run, with one outbox kept
    across restarts; each start logs to ``runner-<n>.log``. The key is passed in the environment
    (``PAPERCLIP_API_KEY``), never on the command line."""

    def __init__(self, tmp_path: Path, *, url: str, key: str, run_id, script: Path, extra=()):
        self.tmp_path = Path(tmp_path)
        self.outbox = self.tmp_path / "outbox.sqlite3"
        self.argv = [sys.executable, "-m", "prp_runner", "--url", url, "--run-id", str(run_id),
                     "--outbox", str(self.outbox), "--cwd", str(self.tmp_path), "--harness", "fake",
                     "--script", str(script), *extra]
        drop = ("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "PAPERCLIP_RUNNER_URL", "PAPERCLIP_RUN_ID")
        self.env = {k: v for k, v in os.environ.items() if k not in drop}
        self.env.update({"PAPERCLIP_API_KEY": key, "PYTHONPATH": str(BASE_DIR), "PYTHONUNBUFFERED": "1"})
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    @property
    def proc(self) -> subprocess.Popen:
        return self.procs[-1]

    def start(self):
        log = self.tmp_path / f"runner-{len(self.logs) + 1}.log"
        self.logs.append(log)
        with open(log, "wb") as out:
            self.procs.append(subprocess.Popen(self.argv, cwd=self.tmp_path, env=self.env, stdin=subprocess.DEVNULL,
                                               stdout=out, stderr=subprocess.STDOUT, start_new_session=True))

    def alive(self) -> bool:
        return bool(self.procs) and self.proc.poll() is None

    def kill(self):
        """SIGKILL the runner's process group (the runner and anything its harness started)."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.procs:
            self.proc.wait(timeout=10)

    def wait(self, *, timeout: float, logs=None) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the runner did not exit within {timeout}s" + (logs or self.dump)())

    def dump(self) -> str:
        return "".join(f"\n--- {log.name} ---\n{_tail(log)}" for log in self.logs)


class FaultRig:
    """The web process, the proxy in front of it and the runners started for one test."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = Path(tmp_path)
        self.server = HostServer(self.tmp_path)
        self.server.start()
        self.proxy = FaultProxy(self.server.port)
        self.runners: list[RunnerProcess] = []

    def runner(self, run, key, script: Path, *extra) -> RunnerProcess:
        url = f"{self.proxy.url}/api/runner/v1/runs/{run.pk}/"
        runner = RunnerProcess(self.tmp_path, url=url, key=key, run_id=run.pk, script=script, extra=extra)
        self.runners.append(runner)
        return runner

    def dump(self) -> str:
        return "".join(r.dump() for r in self.runners) + self.server.dump() + self.proxy.dump()

    def close(self):
        for runner in self.runners:
            runner.kill()
        self.proxy.close()
        self.server.kill()
