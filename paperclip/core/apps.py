from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "paperclip.core"
    label = "core"
