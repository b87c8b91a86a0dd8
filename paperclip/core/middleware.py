"""The console's current company.

For a logged-in user ``request.user_companies`` lists the companies the user belongs to
(every company for a superuser) and ``request.company`` is the one selected in the session
(``company_id``), falling back to the first of them. Anonymous requests, including agents
calling the API with a bearer key, get ``None`` and ``()`` without touching the database.
"""
from django.apps import apps

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
