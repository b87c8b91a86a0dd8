# Two commands do all set-up on a fresh machine with only Python 3.11+:
#   make run   - virtualenv, install, migrate, demo company, server on 127.0.0.1:8000
#   make test  - virtualenv, install, the whole suite (parallel)
#   make serve - production: migrate, collectstatic, gunicorn (gunicorn.conf.py), DEBUG off
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_WORKERS ?= auto

.PHONY: run test install migrate demo schema bench clean serve

# The demo: the GitHub sandbox on loopback is the one non-public address the server may call (plain
# http, loopback only), and its token and webhook secret are fresh random values at each start,
# referenced by the connector as env:PAPERCLIP_SECRET_* names (never stored) that the allow-list
# gives to the demo company (DEMO) only.
run demo: export PAPERCLIP_OUTBOUND_ALLOWED_HOSTS = 127.0.0.1:8765
run demo: export PAPERCLIP_SECRET_ENV_ALLOWLIST = DEMO:PAPERCLIP_SECRET_GITHUB_SANDBOX_*
run demo: export PAPERCLIP_OUTBOUND_ALLOW_HTTP = true
run demo: export PAPERCLIP_SECRET_GITHUB_SANDBOX_TOKEN := $(shell $(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(24))')
run demo: export PAPERCLIP_SECRET_GITHUB_SANDBOX_WEBHOOK_SECRET := $(shell $(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(24))')

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

install: $(VENV)/.installed

migrate: install
	$(PY) manage.py migrate --noinput

demo: migrate
	$(PY) manage.py seed_demo

run: demo
	$(PY) manage.py collectstatic --noinput -v0
	@echo "Paperclip on http://127.0.0.1:8000/  (log in as printed above; API docs at /api/docs/)"
	@echo "$${PAPERCLIP_DEMO_PROVIDER:-github} sandbox on http://127.0.0.1:8765/ opens a demo task once the server answers (see Connectors)."
	@# The in-process worker starts agent runs (no broker needed); the GitHub sandbox serves the demo
	@# connector and runs the connector sweep (token and secret exported above); all stop with the server.
	@$(PY) manage.py paperclip_worker & worker=$$!; \
	  $(PY) manage.py demo_sandbox & sandbox=$$!; \
	  trap 'kill $$worker $$sandbox 2>/dev/null' EXIT INT TERM; \
	  $(PY) manage.py runserver 127.0.0.1:8000

# Production web server: gunicorn with threaded workers (PAPERCLIP_WEB_WORKERS, PAPERCLIP_WEB_THREADS,
# PAPERCLIP_BIND; see gunicorn.conf.py), static files from var/static through whitenoise. Needs
# SECRET_KEY (and ALLOWED_HOSTS off loopback): gunicorn.conf.py refuses to start without them. Runs
# are dispatched by separate processes (celery worker + beat with a broker, or manage.py paperclip_worker).
serve: export DEBUG = false
serve: export WHITENOISE_USE_FINDERS = false
serve: install
	@$(PY) gunicorn.conf.py
	$(PY) manage.py migrate --noinput
	$(PY) manage.py collectstatic --noinput -v0
	exec $(VENV)/bin/gunicorn -c gunicorn.conf.py

test: install
	$(PY) -m pytest -n $(PYTEST_WORKERS) -q

schema: install
	$(PY) manage.py spectacular --validate --fail-on-warn --file var/openapi.yaml

bench: install  # each prints its figure next to a baseline measured in the same run
	$(PY) bench/checkout_bench.py --server gunicorn
	$(PY) bench/checkout_bench.py
	$(PY) bench/wake_bench.py
	$(PY) bench/webhook_bench.py --server gunicorn --skip-apply
	$(PY) bench/webhook_bench.py
	$(PY) bench/apply_bench.py --tasks 1000  # a backlog of 5,000 events for the two-worker scaling figure
	$(PY) bench/apply_bench.py --prior-issues 20000 --skip-celery --output bench/results/apply-prior-issues.json
	$(PY) bench/symphony_latency_bench.py
	$(PY) bench/case_read_bench.py
	$(PY) bench/timestamp_load_bench.py
	$(PY) bench/prp_intake_bench.py
	$(PY) bench/prp_runner_bench.py

clean:
	rm -rf $(VENV) var staticfiles
