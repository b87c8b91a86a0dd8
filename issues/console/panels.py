"""Extension point of the issue page for apps that depend on ``issues`` (it never imports them).

An issue panel is a callable ``panel(request, issue) -> (template_name, context) | None`` registered
from the app's ``AppConfig.ready()`` (e.g. the connectors app's link panel, §12.3). The issue page
includes each returned template with ``panel`` bound to the context, at the top of its side column.
"""
ISSUE_PANELS: list = []


def register_issue_panel(panel):
    if panel not in ISSUE_PANELS:
        ISSUE_PANELS.append(panel)
    return panel


def issue_panels(request, issue) -> list:
    return [panel for panel in (fn(request, issue) for fn in ISSUE_PANELS) if panel]
