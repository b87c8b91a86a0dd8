"""Routes of the upstream-compatible API (issue #14): board API keys (paperclip-api.md §2.5);
included by issues/api/urls.py."""
from django.urls import path

from . import board_keys

urlpatterns = [
    path("board-api-keys", board_keys.BoardApiKeysView.as_view(), name="board-api-keys"),
    path("board-api-keys/<str:key_id>", board_keys.BoardApiKeyView.as_view(), name="board-api-key"),
]
