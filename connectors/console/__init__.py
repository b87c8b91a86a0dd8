"""The connectors app's operator console: instance list and health (§12.2), the conflict queue
(§11.3), the issue page's link panel (§12.3) and the dashboard's connector summary. Routes in
``connectors/console_urls.py``; the panels are registered in ``ConnectorsConfig.ready()``."""
