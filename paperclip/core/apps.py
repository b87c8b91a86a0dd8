from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "paperclip.core"
    label = "core"

    def ready(self):
        from django.db.backends.signals import connection_created

        from . import schema  # noqa: F401  (registers the OpenAPI extension of strict input serializers)
        from .pg_timestamps import use_compiled_timestamptz

        connection_created.connect(use_compiled_timestamptz, dispatch_uid="paperclip.core.pg_timestamps")
