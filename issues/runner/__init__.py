"""The Paperclip Runner Protocol (PRP v1/v2), host side.

Layers, lowest first (a module imports only those above it in this list):

* ``contract``    — the JSON Schemas (``schemas/``, copied from upstream), compiled once; envelope
                    validation that fails closed on unsupported versions and schema discriminators;
                    canonical JSON and digests. Pure, no database.
* ``reducer``     — the session reducer: events -> ``paperclip.prp.session-snapshot.v1`` and its
                    parity summary. Pure, no database (``manage.py prp_replay``, the run page).
* ``commands``    — the command lane: durable command rows, ``controllerSeq`` contiguous per run.
* ``projections`` — what a committed event changes (run log, spend, result/terminal, requests,
                    goals, credentials, activity), called inside the commit that stores the events.
* ``negotiation`` / ``intake`` — hello, and the event batch with its cumulative acknowledgement.

The HTTP transport is ``issues.api.runner`` (``/api/runner/v1/runs/{runId}/…``).
"""
