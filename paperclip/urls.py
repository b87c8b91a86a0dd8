from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerSplitView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves Swagger UI's start script as a file (?script): no inline script (the CSP).
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="api-redoc"),
    path("api/runner/v1/", include("issues.api.urls_runner")),
    # Django tries patterns in order and a request pays for every miss before its match: the busiest
    # first (webhook deliveries, then the agents' heartbeat calls). They are disjoint
    # (tests/test_url_order.py), so the order changes nothing else.
    path("api/", include("connectors.api.urls")),
    path("api/", include("issues.api.urls")),
    path("api/", include("cases.api.urls")),
    path("", include("cases.console_urls")),
    path("", include("connectors.console_urls")),
    path("", include("issues.urls")),
]

handler404 = "paperclip.core.errors.json_not_found"
handler500 = "paperclip.core.errors.json_server_error"
