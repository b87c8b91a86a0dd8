import os
import warnings

import pytest
from django.conf import settings
from django.db import connection
from rest_framework.test import APIClient

from issues.services.companies import agent_api_key_create
from tests.factories import AgentFactory, CompanyFactory, IssueFactory, MembershipFactory, RunFactory, UserFactory

# Fixture modules every test may ask for by name (the provider sandboxes, fast connector retries),
# registered once here instead of imported into each test module.
pytest_plugins = [
    "tests.asana_sandbox",
    "tests.connector_helpers",
    "tests.github_sandbox",
    "tests.jira_sandbox",
    "tests.linear_sandbox",
    "tests.notion_sandbox",
    "tests.trello_sandbox",
]


def is_postgres():
    return connection.vendor == "postgresql"


class AgentClient(APIClient):
    """An APIClient speaking as one agent, with its key and (optionally) a run header."""

    def __init__(self, agent, raw_key, run=None):
        super().__init__()
        self.agent, self.raw_key, self.run = agent, raw_key, run
        self.use_run(run)

    def use_run(self, run):
        self.run = run
        headers = {"HTTP_AUTHORIZATION": f"Bearer {self.raw_key}"}
        if run is not None:
            headers["HTTP_X_PAPERCLIP_RUN_ID"] = str(run.pk)
        self.credentials(**headers)
        return self


# The local provider sandboxes and http-adapter receivers listen on loopback over plain http: the
# suite allows exactly that, as `make run` does for the demo sandbox (paperclip.core.outbound_http).
# Set in the environment too, so worker subprocesses started by tests inherit it.
LOOPBACK_OUTBOUND = {"OUTBOUND_ALLOWED_HOSTS": ["127.0.0.1", "localhost", "::1"], "OUTBOUND_ALLOW_HTTP": True}


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's test database, which it drops at the end; on PostgreSQL a session still
    connected then (a killed subprocess's backend not yet gone, a thread's unclosed connection)
    made the DROP fail and left the database on the server. Such sessions are ended first, and
    named in a warning so that the one left open can be found."""
    yield
    if not is_postgres():
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute("SELECT pid, application_name, state, left(query, 200), pg_terminate_backend(pid) "
                       "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
        lingering = cursor.fetchall()
    connection.close()
    if lingering:
        warnings.warn(f"sessions still connected to the test database were ended: {lingering}", stacklevel=1)


@pytest.fixture(autouse=True, scope="session")
def _connector_kicks_eager():
    """The suite applies a stored webhook right after its commit (kicks on, Celery eager), so a test
    sees the effects of the delivery it posted. The embedded default (kicks off: the in-process worker
    drains the inbox) is pinned by tests/test_connectors_embedded_worker.py."""
    settings.CONNECTORS["KICK_ON_COMMIT"] = True
    yield


@pytest.fixture(autouse=True, scope="session")
def _loopback_outbound_allowed():
    settings.PAPERCLIP.update(LOOPBACK_OUTBOUND)
    os.environ["PAPERCLIP_OUTBOUND_ALLOWED_HOSTS"] = ",".join(LOOPBACK_OUTBOUND["OUTBOUND_ALLOWED_HOSTS"])
    os.environ["PAPERCLIP_OUTBOUND_ALLOW_HTTP"] = "true"
    yield


@pytest.fixture(autouse=True, scope="session")
def _secret_env_single_tenant():
    """The suite's companies share the test process's environment as one tenant's would: allow-list
    entries without a company apply to all of them. The default (entries bound to a company, as
    `make run` binds the demo's) is pinned by tests/test_secret_refs_tenancy.py."""
    settings.PAPERCLIP["SECRET_ENV_SINGLE_TENANT"] = True
    os.environ["PAPERCLIP_SECRET_ENV_SINGLE_TENANT"] = "true"
    yield


@pytest.fixture(autouse=True, scope="session")
def _attachments_in_a_temporary_folder(tmp_path_factory):
    """Uploaded bytes go to this session's own folder (each xdist worker has one), not the checkout's var/."""
    from django.test import override_settings

    storages = {**settings.STORAGES, "attachments": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(tmp_path_factory.mktemp("attachments")), "base_url": None}}}
    with override_settings(STORAGES=storages):
        yield


@pytest.fixture
def own_attachment_storage(settings, tmp_path):
    """A storage folder of this test's own, for tests that walk the whole storage (the orphan sweep):
    the session's folder also holds files other tests left behind when their rows rolled back."""
    settings.STORAGES = {**settings.STORAGES, "attachments": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(tmp_path / "attachments"), "base_url": None}}}


@pytest.fixture
def company(db):
    return CompanyFactory()


@pytest.fixture
def cases_company(company):
    company.enable_cases = True
    company.save()
    return company


@pytest.fixture
def make_agent_client(db):
    def make(agent=None, *, company=None, with_run=True, **agent_kwargs):
        if agent is None:
            agent = AgentFactory(company=company or CompanyFactory(), **agent_kwargs)
        _, raw = agent_api_key_create(agent=agent)
        run = RunFactory(agent=agent) if with_run else None
        return AgentClient(agent, raw, run)

    return make


@pytest.fixture
def agent_client(make_agent_client, company):
    return make_agent_client(company=company)


@pytest.fixture
def board_user(company):
    return MembershipFactory(company=company, role="owner").user


@pytest.fixture
def board_client(board_user):
    client = APIClient()
    client.force_login(board_user)
    return client


@pytest.fixture
def issue(company):
    return IssueFactory(company=company)


__all__ = ["AgentClient", "is_postgres", "UserFactory"]
