"""What a company admin configures never runs as the server: workspace hooks and local agent commands
are staff-set, the WORKFLOW.md of an https repository brings no hooks, the server's /proc entries are
closed to its children, and git reaches an https repository only through the outbound guard
(README, "Trust boundary"; issues.services.host_commands)."""
from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from ipaddress import ip_address
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from issues.models import Agent, Project, RunEvent
from issues.services.run_policy import run_policy_for
from issues.workspaces import service
from issues.workspaces.errors import WorkspaceConfigError, WorkspaceGitFailed
from paperclip.core import hardening, outbound_http
from tests.factories import AgentFactory, MembershipFactory
from tests.test_errors import assert_error
from tests.test_workspaces import (  # noqa: F401 (fixtures)
    _git_isolation,
    admitted,
    agent,
    company,
    make_project,
    new_issue,
    new_run,
    project,
    repo,
    root,
)

HOOKED = "---\nhooks:\n  after_create: \"cat /proc/$PPID/environ > leaked.txt\"\n---\nDo the work.\n"


def board(company, role="admin", **user):
    client = APIClient()
    client.force_login(MembershipFactory(company=company, role=role, **{f"user__{k}": v for k, v in user.items()}).user)
    return client


# --- hooks: staff set them ------------------------------------------------------------------------------

def test_an_operator_cannot_put_shell_hooks_in_the_workflow_document(root, project, company, new_issue, admitted):
    operator, staff = board(company, role="operator"), board(company, role="owner", is_staff=True)
    url = f"/api/projects/{project.pk}"
    assert_error(operator.patch(url, {"workflowDocument": HOOKED}, format="json"), 403, "hooks_staff_only",
                 fields=("workflowDocument",))
    assert_error(operator.post(f"/api/companies/{company.pk}/projects", {"name": "New", "workflowDocument": HOOKED},
                               format="json"), 403, "hooks_staff_only", fields=("workflowDocument",))
    project.refresh_from_db()
    assert project.workflow_document == "" and not Project.objects.filter(name="New").exists()
    workspace, _run = admitted(new_issue(project=project))
    assert not (Path(workspace.path) / "leaked.txt").exists()

    # A document without hooks is anyone's; staff set hooks; a body edit that keeps them is fine.
    assert operator.patch(url, {"workflowDocument": "---\nagent:\n  max_turns: 3\n---\nGo"},
                          format="json").status_code == 200
    staffed = "---\nhooks:\n  before_run: make deps\n---\nGo"
    assert staff.patch(url, {"workflowDocument": staffed}, format="json").status_code == 200
    assert operator.patch(url, {"workflowDocument": staffed + " carefully"}, format="json").status_code == 200
    changed = staffed.replace("make deps", "make deps; id")
    assert_error(operator.patch(url, {"workflowDocument": changed}, format="json"), 403, "hooks_staff_only")
    project.refresh_from_db()
    assert project.workflow_document == staffed + " carefully"
    assert run_policy_for(agent=None, project=project).hooks == {"before_run": "make deps"}


def test_the_workflow_md_hooks_of_an_https_repository_are_ignored_and_the_run_says_so(
        root, project, company, new_issue, admitted, monkeypatch, settings):
    workspace, run = admitted(new_issue(project=project))
    # The project now names an https repository (any board user may), whose WORKFLOW.md carries hooks.
    Project.objects.filter(pk=project.pk).update(repository="https://git.example.com/org/app.git")
    monkeypatch.setattr("issues.workflow.effective.repository_workflow_memo",
                        lambda p: "---\nhooks:\n  before_run: \"touch hooked.txt\"\n---\nGo")
    workspace.project.refresh_from_db()

    policy = run_policy_for(agent=None, project=workspace.project)
    assert policy.hooks == {} and "before_run" in policy.hooks_ignored
    assert service._hook(workspace, "before_run", issue=run.issue, run=run) is None
    assert not (Path(workspace.path) / "hooked.txt").exists()
    (note,) = RunEvent.objects.filter(run=run, data__hookIgnored=True)
    assert "before_run" in note.message and "https" in note.message and "TRUST_REPOSITORY_HOOKS" in note.message

    settings.PAPERCLIP = {**settings.PAPERCLIP, "TRUST_REPOSITORY_HOOKS": True}  # a single-tenant server
    assert service._hook(workspace, "before_run", issue=run.issue, run=run).ok
    assert (Path(workspace.path) / "hooked.txt").exists()


def test_connector_workflow_defaults_carry_no_hooks():
    from connectors.services.workflow_policy import workflow_defaults_hook_errors

    assert workflow_defaults_hook_errors({"workflowDefaults": {"hooks": {"before_run": "id", "timeout_ms": 5}}}) \
        == {"config.workflowDefaults.hooks.before_run": [
            "Hooks are commands on this server: a staff user sets them in the project's workflow document, not here."]}
    assert workflow_defaults_hook_errors({"workflowDefaults": {"agent": {"max_turns": 2}}}) == {}


# --- local agent processes: staff set their command ---------------------------------------------------------

PROCESS = {"adapterType": "process", "adapterConfig": {"command": ["sh", "-c", "cat /proc/$PPID/environ"]}}


def test_a_process_agent_command_is_set_by_staff_only(company, make_agent_client):
    admin, staff = board(company, role="admin"), board(company, role="owner", is_staff=True)
    url = f"/api/companies/{company.pk}/agents"
    assert_error(admin.post(url, {"name": "Shell", **PROCESS}, format="json"), 403, "command_staff_only",
                 fields=("adapterConfig.command",))
    assert_error(admin.post(url, {"name": "Runner", "adapterType": "runner",
                                  "adapterConfig": {"command": ["x"], "cwd": "/srv"}}, format="json"),
                 403, "command_staff_only", fields=("adapterConfig.command", "adapterConfig.cwd"))
    assert not Agent.objects.filter(name__in=("Shell", "Runner")).exists()
    created = staff.post(url, {"name": "Shell", **PROCESS}, format="json")
    assert created.status_code == 201, created.content
    agent_id = created.json()["id"]

    # An admin keeps the command as staff set it, or leaves local processes.
    assert admin.patch(f"/api/agents/{agent_id}", {"adapterConfig": {**PROCESS["adapterConfig"], "grace_seconds": 2}},
                       format="json").status_code == 200
    assert_error(admin.patch(f"/api/agents/{agent_id}", {"adapterConfig": {
        "command": ["sh", "-c", "id"], "grace_seconds": 2}}, format="json"), 403, "command_staff_only")
    assert_error(admin.patch(f"/api/agents/{agent_id}", {"adapterConfig": {
        **PROCESS["adapterConfig"], "env": {"LD_PRELOAD": "/tmp/x.so"}}}, format="json"),
        403, "command_staff_only", fields=("adapterConfig.env",))
    assert Agent.objects.get(pk=agent_id).adapter_config == {**PROCESS["adapterConfig"], "grace_seconds": 2}
    assert admin.post(url, {"name": "Fake", "adapterType": "prp", "adapterConfig": {
        "harness": "fake", "script": "happy-path"}}, format="json").status_code == 201
    # An agent allowed to hire is no staff user either.
    hirer = make_agent_client(AgentFactory(company=company, permissions={"canCreateAgents": True}))
    assert_error(hirer.post(url, {"name": "Hired", **PROCESS}, format="json"), 403, "command_staff_only")


def test_the_console_adapter_form_refuses_a_command_from_a_company_admin(company):
    from django.test import Client
    from django.urls import reverse

    agent = AgentFactory(company=company)
    url = reverse("console:agent-adapter", args=[agent.pk])
    config = '{"command": ["python", "a.py"]}'
    for staff, status in ((False, 400), (True, 302)):
        client = Client()
        client.force_login(MembershipFactory(company=company, role="admin", user__is_staff=staff).user)
        response = client.post(url, {"adapter_type": "process", "adapter_config": config})
        assert response.status_code == status, response.content[:300]
    agent.refresh_from_db()
    assert agent.adapter_config == {"command": ["python", "a.py"]}


# --- /proc: the server's environment is not its children's to read -------------------------------------------

def test_the_server_process_is_not_dumpable():
    if not sys.platform.startswith("linux"):
        pytest.skip("prctl is Linux's")
    assert hardening.dumpable() == 0  # set when the project was loaded (paperclip/__init__.py)


PROBE = """
import importlib.util, os, subprocess, sys
spec = importlib.util.spec_from_file_location("hardening", sys.argv[1])
module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
if sys.argv[2] == "1":
    assert module.deny_environ_readers()
out = subprocess.run(["sh", "-c", "cat /proc/$PPID/environ"], capture_output=True, env={"PATH": "/usr/bin:/bin"})
sys.stdout.write("LEAKED" if b"PROBE_SERVER_SECRET=s3cret" in out.stdout else "CLOSED")
"""


def _as_nobody():
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


def _runs(python: str, as_nobody: bool) -> bool:
    try:
        return subprocess.run([python, "-c", ""], preexec_fn=_as_nobody if as_nobody else None, cwd="/",
                              capture_output=True, timeout=30).returncode == 0
    except OSError:
        return False


def test_a_child_of_a_non_root_server_cannot_read_its_environment():
    """As root (this suite's machine) the "server" is a python process switched to nobody first: root
    reads every /proc entry anyway, which is why the server must not run as root."""
    if not sys.platform.startswith("linux"):
        pytest.skip("prctl is Linux's")
    root = os.geteuid() == 0
    python = next((p for p in (sys.executable, shutil.which("python3"), "/usr/bin/python3")
                   if p and _runs(p, root)), None)
    assert python is not None, "no interpreter a non-root user may run: the /proc check would not run"
    folder = Path(tempfile.mkdtemp())
    os.chmod(folder, 0o755)  # readable by the non-root "server"
    probe, hardening_py = folder / "probe.py", folder / "hardening.py"
    probe.write_text(PROBE)
    hardening_py.write_text(Path(hardening.__file__).read_text())

    def server(deny: str) -> str:
        return subprocess.run([python, str(probe), str(hardening_py), deny], preexec_fn=_as_nobody if root else None,
                              env={"PATH": "/usr/bin:/bin", "PROBE_SERVER_SECRET": "s3cret"}, cwd="/",
                              capture_output=True, text=True, timeout=30).stdout

    try:
        assert server("0") == "LEAKED"  # the same user reads a dumpable parent's environment...
        assert server("1") == "CLOSED"  # ...and not once it is non-dumpable
    finally:
        shutil.rmtree(folder)


# --- git: an https repository through the outbound guard, at every use ------------------------------------

@pytest.fixture
def strict_outbound(settings):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "OUTBOUND_ALLOWED_HOSTS": [], "OUTBOUND_ALLOW_HTTP": False,
                          "WORKSPACE_GIT_TIMEOUT_SECONDS": 10}


@pytest.fixture
def listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.2)
    seen = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            seen.append(conn.recv(64))
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield srv.getsockname()[1], seen
    stop.set()
    thread.join()
    srv.close()


def test_git_never_reaches_a_loopback_address_an_https_repository_resolves_to(
        root, strict_outbound, make_project, new_issue, admitted, listener, monkeypatch):
    port, seen = listener
    literal = make_project(repository=f"https://127.0.0.1:{port}/r.git")  # a row written before the check
    with pytest.raises(WorkspaceConfigError) as refused:
        admitted(new_issue(project=literal))
    assert refused.value.code == "workspace_repository_refused"
    assert f"https://127.0.0.1:{port}/r.git" in refused.value.message and "non-public" in refused.value.message

    # A name that did not resolve when written, and resolves to loopback now (DNS rebinding).
    real = outbound_http._resolve
    monkeypatch.setattr(outbound_http, "_resolve", lambda host, p: [ip_address("127.0.0.1")]
                        if host == "rebind.paperclip.test" else real(host, p))
    rebinding = make_project(name="Rebinding", repository=f"https://rebind.paperclip.test:{port}/r.git")
    with pytest.raises(WorkspaceConfigError, match="rebind.paperclip.test"):
        admitted(new_issue(project=rebinding))
    assert seen == []  # git never ran: not a byte reached the address


def test_git_is_pinned_to_the_checked_address_with_no_proxy_and_no_redirect(
        root, settings, make_project, new_issue, admitted, monkeypatch):
    # Loopback over plain http is allowed here (the suite's settings); "localhost" is made to resolve to
    # 127.0.0.2, where the only server listens: git reaches it only through the pinned address.
    seen, elsewhere = [], []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{other.server_address[1]}/internal")
            self.end_headers()

        def log_message(self, *args):
            pass

    class Other(Handler):
        def do_GET(self):
            elsewhere.append(self.path)
            self.send_response(200)
            self.end_headers()

    server = http.server.HTTPServer(("127.0.0.2", 0), Handler)
    other = http.server.HTTPServer(("127.0.0.1", 0), Other)
    for srv in (server, other):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        real = outbound_http._resolve
        monkeypatch.setattr(outbound_http, "_resolve", lambda host, p: [ip_address("127.0.0.2")]
                            if host == "localhost" else real(host, p))
        for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
            monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens: a proxy used would fail first
        settings.PAPERCLIP = {**settings.PAPERCLIP, "WORKSPACE_GIT_TIMEOUT_SECONDS": 20}
        project = make_project(repository=f"http://localhost:{server.server_address[1]}/r.git")
        with pytest.raises(WorkspaceGitFailed) as failed:
            admitted(new_issue(project=project))
    finally:
        for srv in (server, other):
            srv.shutdown()
            srv.server_close()
    assert seen and seen[0].startswith("/r.git/info/refs")  # reached through the pinned 127.0.0.2
    assert elsewhere == []  # the redirect was not followed
    assert failed.value.details["stderr"] == "(see the server log)"  # the remote's answer is not repeated


# --- a tenant's repository gets nothing of the server's git setup -----------------------------------------
def test_git_sends_none_of_the_servers_credentials_to_an_https_repository(
        root, settings, tmp_path, make_project, new_issue, admitted):
    """The server's git config may hold a credential helper or an extra header (for its own remotes): a
    company admin's repository URL must get neither, however it asks (a 401 challenge)."""
    (tmp_path / "gitconfig").write_text(  # the server's global config (tests/test_workspaces._git_isolation)
        '[credential]\n\thelper = "!f() { echo username=server; echo password=SERVER-TOKEN; }; f"\n'
        '[http]\n\textraHeader = "X-Server-Secret: SERVER-HEADER"\n')
    seen = []

    class Challenge(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append({k.lower(): v for k, v in self.headers.items()})
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Challenge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings.PAPERCLIP = {**settings.PAPERCLIP, "WORKSPACE_GIT_TIMEOUT_SECONDS": 20}
        tenant = make_project(repository=f"http://127.0.0.1:{server.server_address[1]}/private.git")
        with pytest.raises(WorkspaceGitFailed):
            admitted(new_issue(project=tenant))
    finally:
        server.shutdown()
        server.server_close()
    assert seen  # git asked, was challenged, and had nothing of the server's to answer with
    assert all("authorization" not in h and "x-server-secret" not in h for h in seen), seen


def test_a_symlinked_packet_ignore_file_writes_nothing_outside_the_workspace(tmp_path):
    """A repository's content is the tenant's: a ``.paperclip/.gitignore`` symlink naming a file the
    server could write (one that does not exist yet) is left alone; the packet is written beside it."""
    from issues.run_context import packet_file_write
    from tests.test_workspaces import git, make_repo

    target = tmp_path / "outside" / ".gitconfig"
    target.parent.mkdir()
    hostile = make_repo(tmp_path / "hostile")
    (hostile / ".paperclip").mkdir()
    os.symlink(target, hostile / ".paperclip" / ".gitignore")
    git("add", ".paperclip/.gitignore", cwd=hostile)
    git("commit", "-q", "-m", "a link out", cwd=hostile)
    checkout = tmp_path / "checkout"
    git("clone", "-q", str(hostile), str(checkout))
    path, temporary = packet_file_write("PACKET", workspace_path=str(checkout), run_id="r1")
    assert not target.exists() and not os.path.lexists(target)
    assert (path, temporary) == (str(checkout / ".paperclip" / "task-packet.md"), False)
    assert Path(path).read_text() == "PACKET"


def test_companies_sharing_a_repository_url_never_see_each_others_branches(db, root, tmp_path):
    """One clone per company: company A's base ref or branch template naming company B's branch finds
    nothing of B's (B's agents' unpushed commits stay B's)."""
    from django.utils import timezone

    from issues.models import HeartbeatRun
    from tests.factories import CompanyFactory, IssueFactory, ProjectFactory, RunFactory
    from tests.test_workspaces import commit_file, git, make_repo

    origin = tmp_path / "origin.git"
    git("init", "-q", "--bare", "-b", "main", str(origin))
    seed = make_repo(tmp_path / "seed")
    git("remote", "add", "origin", str(origin), cwd=seed)
    git("push", "-q", "origin", "main", cwd=seed)
    url = origin.as_uri()  # one URL both companies set (the clone is what they could share)

    def admit(issue):
        run = RunFactory(agent=AgentFactory(company=issue.company), issue=issue, status="running")
        return service.workspace_admit(issue=issue, run=run)

    def project(company, **fields):
        return ProjectFactory(company=company, repository=url, workspace_strategy="isolated_workspace",
                              workspace_hooks={}, hook_timeout_seconds=10, **fields)

    a, b = CompanyFactory(issue_prefix="AA"), CompanyFactory(issue_prefix="BB")
    theirs = admit(IssueFactory(company=b, project=project(b, base_ref="main"), status="todo"))
    commit_file(Path(theirs.path), "b-secret.txt", "company B's unpushed work\n")
    HeartbeatRun.objects.filter(workspace=theirs).update(status="succeeded", finished_at=timezone.now())
    service.workspace_remove(workspace=theirs)  # B's branch stays in B's clone

    with pytest.raises(WorkspaceConfigError) as missing:  # A names B's branch as its base ref
        admit(IssueFactory(company=a, project=project(a, base_ref=theirs.branch), status="todo"))
    assert missing.value.code == "base_ref_missing"
    colliding = project(a, base_ref="main", branch_template=theirs.branch)  # B's branch name, verbatim
    mine = admit(IssueFactory(company=a, project=colliding, status="todo"))
    assert mine.branch == theirs.branch  # the same name, in A's own clone: a fresh branch from main
    assert not (Path(mine.path) / "b-secret.txt").exists() and (Path(mine.path) / "README.md").exists()
