"""The company dashboard: what an operator on call looks at first."""
from django.views.decorators.http import require_GET

from issues.selectors import company_dashboard

from .base import render_page
from .permissions import console_page

# Extension point for apps that depend on ``issues`` (it never imports them): a panel is a callable
# ``panel(company) -> (template_name, context) | None`` registered from the app's AppConfig.ready(),
# e.g. the connectors app's health summary and open conflict count.
DASHBOARD_PANELS: list = []


def register_dashboard_panel(panel):
    if panel not in DASHBOARD_PANELS:
        DASHBOARD_PANELS.append(panel)
    return panel


@console_page
@require_GET
def dashboard(request):
    company = request.company
    context = {"company": company}
    if company is not None:
        context.update(company_dashboard(company=company))
        context["panels"] = [panel for panel in (fn(company) for fn in DASHBOARD_PANELS) if panel]
    return render_page(request, "console/dashboard.html", None, context)
