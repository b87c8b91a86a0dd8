"""PRP transport routes, mounted at /api/runner/v1/ (paperclip/urls.py)."""
from django.urls import path

from . import runner

urlpatterns = [
    path("attach", runner.RunnerAttachView.as_view(), name="runner-attach"),
    path("runs/<uuid:run_id>/hello", runner.RunnerHelloView.as_view(), name="runner-hello"),
    path("runs/<uuid:run_id>/events", runner.RunnerEventsView.as_view(), name="runner-events"),
    path("runs/<uuid:run_id>/commands", runner.RunnerCommandsView.as_view(), name="runner-commands"),
    path("runs/<uuid:run_id>/commands/<str:command_id>/result", runner.RunnerCommandResultView.as_view(),
         name="runner-command-result"),
]
