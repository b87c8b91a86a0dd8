"""Local, dependency-free stand-ins for provider APIs (tests and the offline demo).

Nothing here imports Django. See :mod:`connectors.sandbox.github`."""
