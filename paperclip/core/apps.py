from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "paperclip.core"
    label = "core"

    def ready(self):
        from . import schema  # noqa: F401  (registers the OpenAPI extension of strict input serializers)
