from django.apps import AppConfig


class CasesConfig(AppConfig):
    name = "cases"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import receivers

        receivers.connect()
