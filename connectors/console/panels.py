"""Panels the connectors app adds to pages of the issues console (registered in AppConfig.ready())."""
from __future__ import annotations

from django.urls import reverse

from issues.console.permissions import ACT_ON_WORK, ADMIN, has_role

from . import capabilities, selectors
from .common import new_key


def dashboard_panel(company):
    """Connector health summary and the open conflict count (nothing when there is no connector)."""
    summary = selectors.dashboard_summary(company)
    if not summary["rows"]:
        return None
    return "connectors/_dashboard_panel.html", {
        **summary, "list_url": reverse("connectors_console:instance-list"),
        "conflicts_url": reverse("connectors_console:conflict-list")}


def issue_link_panel(request, issue):
    """§12.3: the link surface of a linked issue (nothing for an issue without links)."""
    surface = selectors.issue_link_surface(issue)
    if not surface:
        return None
    for entry in surface:
        entry["form_key"] = new_key()
        entry["offers"] = capabilities.link_offers(entry["link"].provider_key)  # §5.2: only what it can do
    return "connectors/_issue_link_panel.html", {
        "links": surface, "act": has_role(request, issue.company_id, ACT_ON_WORK),
        "manage": has_role(request, issue.company_id, ADMIN),  # link settings (§7.4 close policy)
        "next": reverse("console:issue-detail", args=[issue.identifier]) + "#link-panel"}
