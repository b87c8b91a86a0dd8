"""Operator alerts on the company dashboard (API ``alerts`` and the console's "Needs attention").

Extension point for apps that depend on ``issues`` (it never imports them): a source is a callable
``source(company) -> list[dict]`` registered from the app's AppConfig.ready(), e.g. the connectors
app's credential failures (§13.1.2). Each alert: ``kind``, ``severity`` (``error``/``warning``),
``title``, ``message``, ``at``, ``entityType``, ``entityId`` and ``url`` (a console page). A source
reads a fixed number of rows whatever the company's size, so the dashboard's query count stays flat."""
from __future__ import annotations

import logging

log = logging.getLogger("issues.alerts")

ALERT_SOURCES: list = []


def register_alert_source(source):
    if source not in ALERT_SOURCES:
        ALERT_SOURCES.append(source)
    return source


def operator_alerts(company) -> list[dict]:
    """Every registered source's alerts for ``company``, errors first, oldest first within a severity."""
    alerts = []
    for source in ALERT_SOURCES:
        try:
            alerts += source(company) or []
        except Exception:  # one failing source must not take the dashboard down
            log.exception("operator alert source %r failed", source)
    return sorted(alerts, key=lambda a: (a.get("severity") != "error", str(a.get("at") or "")))
