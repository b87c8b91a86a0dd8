"""Project middleware: the console's current company, the pages' Content-Security-Policy
(:class:`ConsoleCspMiddleware`), and the API's guard against hostile input (:class:`ApiInputGuardMiddleware`).

For a logged-in user ``request.user_companies`` lists the companies the user belongs to
(every company for a superuser) and ``request.company`` is the one selected in the session
(``company_id``), falling back to the first of them. Anonymous requests, including agents
calling the API with a bearer key, get ``None`` and ``()`` without touching the database.
"""
from django.apps import apps
from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse

from .errors import error_body, payload_too_large_body

SESSION_KEY = "company_id"


def companies_for(user):
    """Companies a board user may open in the console, by name."""
    Company = apps.get_model("issues", "Company")
    if not getattr(user, "is_authenticated", False):
        return Company.objects.none()
    if user.is_superuser:
        return Company.objects.order_by("name", "id")
    return Company.objects.filter(memberships__user=user).order_by("name", "id")


class CurrentCompanyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request.company = None
        request.user_companies = ()
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            companies = list(companies_for(user))
            request.user_companies = companies
            selected = str(request.session.get(SESSION_KEY, ""))
            request.company = next((c for c in companies if str(c.pk) == selected), None) or (
                companies[0] if companies else None
            )
        return self.get_response(request)


# Every HTML page loads only its own scripts: the console's (htmx from static files, no inline
# <script>, no hx-on / js: attributes, which htmx would eval), the admin's (Django's, all files) and
# the API docs' (Swagger UI and ReDoc from the sidecar's static files, started by a script file, not
# inline: paperclip.urls). An injected script, event handler or script URL that got past escaping and
# ``web_link`` still does not run. Inline styles stay allowed: htmx adds its indicator <style>, a few
# templates and the admin use style="", ReDoc styles itself. Images may come from https (Markdown).
CONSOLE_CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: https:; "
               "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
# The API docs fetch the schema (and "try it out" requests) from this origin; ReDoc's search runs in a
# worker it starts from a blob: URL.
API_DOCS_CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                "connect-src 'self'; worker-src 'self' blob:; object-src 'none'; base-uri 'none'; "
                "form-action 'self'; frame-ancestors 'none'")
API_DOCS_PREFIXES = ("/api/docs/", "/api/redoc/")


class ConsoleCspMiddleware:
    """``Content-Security-Policy`` on every HTML response (console, admin, API docs)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (response.get("Content-Type", "").startswith("text/html")
                and "Content-Security-Policy" not in response):
            docs = request.path_info.startswith(API_DOCS_PREFIXES)
            response["Content-Security-Policy"] = API_DOCS_CSP if docs else CONSOLE_CSP
        return response


class ApiInputGuardMiddleware:
    """Hostile input on ``/api/`` answered in the API's error shape before any view runs:

    * a NUL (``%00``) in the path or in a query parameter is a 400 naming it: PostgreSQL's text
      type refuses NUL, so it would otherwise fail inside a lookup as a 500;
    * a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` raised by a plain (non-DRF) view reading
      ``request.body`` is a 413 ``payload_too_large`` instead of Django's HTML "Bad Request"
      (DRF views get the same answer from the exception handler in paperclip.core.errors).
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path_info.startswith("/api/"):
            refused = _nul_in_request(request)
            if refused is not None:
                return refused
        return self.get_response(request)

    def process_exception(self, request, exception):
        if isinstance(exception, RequestDataTooBig) and request.path_info.startswith("/api/"):
            return JsonResponse(payload_too_large_body(), status=413)
        return None


def _nul_in_request(request):
    message = "Contains a NUL character, which is not allowed."
    if "\x00" in request.path_info:
        return JsonResponse(error_body("validation_error", "Invalid input.", {"path": [message]}), status=400)
    query = request.META.get("QUERY_STRING", "")
    if "%00" not in query and "\x00" not in query:
        return None  # the common case: no parsing of the query string here
    bad = sorted({key for key, values in request.GET.lists() if "\x00" in key or any("\x00" in v for v in values)})
    if bad:
        details = {key.replace("\x00", "\\u0000"): [message] for key in bad}
        return JsonResponse(error_body("validation_error", "Invalid input.", details), status=400)
    return None
