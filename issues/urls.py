"""Console routes, included at "" by paperclip/urls.py.

The console pages live in the ``console`` namespace (``console:issue-list``). The auth
routes stay outside it so that Django's conventional names ``login`` and ``logout`` resolve
without a namespace (settings.LOGIN_URL = "login", the admin's "view site" and password
views rely on them).
"""
from django.contrib.auth import views as auth_views
from django.urls import include, path

from . import views
from .console import urls as console_urls

# Not a module-level ``app_name``: that would namespace the auth routes too.
CONSOLE_NAMESPACE = "console"

console_patterns = [
    path("", views.home, name="home"),
    path("issues/", views.issue_list, name="issue-list"),
    path("company/switch/", views.switch_company, name="switch-company"),
    *console_urls.urlpatterns,  # dashboard, board, issue pages, runs, agents (issues/console/)
]

urlpatterns = [
    path("accounts/login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include((console_patterns, CONSOLE_NAMESPACE))),
]
