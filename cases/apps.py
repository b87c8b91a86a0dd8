from django.apps import AppConfig


class CasesConfig(AppConfig):
    name = "cases"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import receivers, sqlite_digest

        receivers.connect()
        sqlite_digest.connect()

        # The issue page shows the task's cases (issues never imports cases: its panel registry).
        from issues.console.panels import register_issue_panel

        from .console import issue_case_panel

        register_issue_panel(issue_case_panel)
