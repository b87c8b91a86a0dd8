"""The operator console, one module per page (dashboard, issues, agents, runs).

Views are thin: they resolve objects inside the user's companies (another company's object is a
404), check the membership role (``permissions``), call the same services as the API and render
templates under ``templates/console/``. htmx requests get fragments; everything reads without
JavaScript.
"""
