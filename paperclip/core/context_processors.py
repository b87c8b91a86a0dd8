def current_company(request):
    """The console's selected company and the companies the user may switch to."""
    return {
        "current_company": getattr(request, "company", None),
        "user_companies": getattr(request, "user_companies", ()),
    }
