"""``manage.py demo_sandbox --provider <key>``: each non-GitHub sandbox of the offline demo, run by its
command in this process against the real webhook endpoint on a live server. The command creates the
"<Provider> sandbox" connector in the demo company, registers webhooks where the provider's API can (the
provider calls the live server back: Asana's handshake, Trello's HEAD), opens a task, and its delivery is
verified, imported and routed to the example agent; a second start re-points the same connector."""
from __future__ import annotations

import socket
from io import StringIO

import pytest
from django.core.management import call_command

from connectors.management.commands._demo_providers import PROVIDERS
from connectors.models import ConnectorInstance, TaskLink
from issues.models import Issue


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_demo_sandbox_of_each_provider_imports_and_routes_its_task(provider, live_server, settings, tmp_path,
                                                                   monkeypatch):
    monkeypatch.setenv("PAPERCLIP_SECRET_GITHUB_SANDBOX_TOKEN", "demo-token-for-tests")  # seed_demo's GitHub one
    monkeypatch.setenv("PAPERCLIP_SECRET_GITHUB_SANDBOX_WEBHOOK_SECRET", "demo-secret-for-tests")
    settings.CONNECTORS = {**settings.CONNECTORS, "PUBLIC_BASE_URL": live_server.url}
    call_command("seed_demo", "--repo-dir", str(tmp_path / "repo"), stdout=StringIO())
    spec = PROVIDERS[provider]
    for _start in (1, 2):
        port = _free_port()
        out = StringIO()
        call_command("demo_sandbox", "--provider", provider, "--once", "--port", str(port), "--server-url",
                     live_server.url, "--sweep", "0", "--wait", "20", stdout=out)
        assert "webhook answered 202" in out.getvalue(), out.getvalue()
        instance = ConnectorInstance.objects.get(company__issue_prefix="DEMO", name=f"{spec.display} sandbox")
        assert str(port) in instance.base_url  # re-pointed at this start's sandbox
        assert not instance.auth_error_at, instance.auth_error_detail  # this start's secrets are the ones used
        # (a restarted in-memory tracker may hand out its first task id again: the same link then)
        link = TaskLink.objects.filter(instance=instance).order_by("-created_at").first()
        assert link is not None and link.status == "healthy"
        issue = Issue.objects.get(pk=link.issue_id)
        assert issue.title == "Fix the broken link in the README"
        assert issue.assignee_agent.name == "Linus"
    assert ConnectorInstance.objects.filter(company__issue_prefix="DEMO", provider_key=spec.provider_key).count() == 1
