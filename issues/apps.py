from django.apps import AppConfig


class IssuesConfig(AppConfig):
    name = "issues"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # The runner protocol (issues.runner) sits above the services: it plugs in through their
        # ports and signals (the stop port, stop expiry on the sweep, answers to runtime requests).
        from issues.runner import host_control, requests

        host_control.connect()
        requests.connect()

        # A stopped company (paused, archived, budget spent) on the dashboard's "Needs attention".
        from issues.operator_alerts import register_alert_source
        from issues.services.company_stop import dashboard_alerts

        register_alert_source(dashboard_alerts)

        # An attachment's stored bytes go when its row's deletion commits, whatever deleted it.
        from issues.services import attachments

        attachments.connect()
