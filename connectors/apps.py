from django.apps import AppConfig


class ConnectorsConfig(AppConfig):
    name = "connectors"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import receivers  # connects the outbound engine to the issues events
        from . import worker_hooks

        # A checkout's claim answers "is it linked?" for the outbound claim receiver (no extra read).
        from issues.events import register_claim_fact

        register_claim_fact(receivers.LINKED_FACT, receivers.linked_fact_sql())

        # Restart recovery at every worker start (§13.2) and the embedded worker's inbox drain.
        worker_hooks.connect()

        # Console panels on the issues app's pages (issues never imports connectors).
        from issues.console.dashboard import register_dashboard_panel
        from issues.console.panels import register_issue_panel

        from .console.panels import dashboard_panel, issue_link_panel

        register_dashboard_panel(dashboard_panel)
        register_issue_panel(issue_link_panel)
        from .console.export import issue_export_panel

        register_issue_panel(issue_export_panel)  # §6.2.2 export, after the link panel

        # Credential failures (§13.1.2) as operator alerts on the company dashboard (API and console).
        from issues.operator_alerts import register_alert_source

        from .services.credential_health import dashboard_alerts

        register_alert_source(dashboard_alerts)

        # Connector defaults for the host's workflow settings, health for invalid documents (§9.5).
        from issues.workflow.effective import register_defaults_provider, register_invalid_listener

        from .services.workflow_policy import host_workflow_defaults, host_workflow_invalid

        register_defaults_provider(host_workflow_defaults)
        register_invalid_listener(host_workflow_invalid)
