"""connectors 0008 clears the tracker URLs stored before they were checked (a ``javascript:`` link
the API and exports would still hand out) and keeps every real one."""
import importlib

from django.apps import apps

from connectors.models import TaskLink
from paperclip.core.links import web_url
from tests.connector_factories import make_instance
from tests.factories import IssueFactory

migration = importlib.import_module("connectors.migrations.0008_clear_unsafe_external_urls")

STORED = {
    "https://github.com/acme/app/issues/1": True,
    "HTTP://tracker.example/ISSUE-2": True,
    "javascript:alert(document.cookie)": False,
    "JavaScript:alert(1)": False,
    "data:text/html,<script>alert(1)</script>": False,
    " https://github.com/acme/app/issues/3": False,  # browsers strip the space before reading the scheme
    "https:///no-host": False,
    "//evil.example/x": False,
    "": True,
}


def test_unsafe_urls_are_cleared_and_web_urls_kept(company):
    instance, _ = make_instance(company)
    links = {}
    for n, url in enumerate(STORED, start=1):
        links[url] = TaskLink.objects.create(
            company=company, instance=instance, provider_key=instance.provider_key, issue=IssueFactory(company=company),
            external_task_id=f"T-{n}", external_key=f"T-{n}", external_url=url)
    migration.clear_unsafe_external_urls(apps, None)
    for url, kept in STORED.items():
        links[url].refresh_from_db()
        assert links[url].external_url == (url if kept else ""), url
        assert bool(web_url(url)) == (kept and url != "")  # the migration's rule is the app's
