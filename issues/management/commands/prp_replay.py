"""``manage.py prp_replay FIXTURE.json [--summary]``: replay a PRP fixture through the session reducer.

Prints the ``paperclip.prp.session-snapshot.v1`` snapshot (``--summary``: the parity summary) as
``json.dumps(indent=2, ensure_ascii=False)`` plus a newline, the format of upstream's golden files,
so the output can be compared with them byte for byte. Exit codes:

* 0 — the fixture was accepted and replayed;
* 2 — the contract refused it (fail closed): nothing on stdout, the reason on stderr as one JSON
  object ``{"error", "code", "details": {"field", "value", "supported", ...}}`` (the API's error
  shape);
* 1 — the file could not be read or is not JSON (a ``CommandError``; argparse usage errors are
  Django's, also 2, but print usage instead of a JSON reason).

No database access: the reducer and the contract are pure.
"""
from __future__ import annotations

import json
import sys

from django.core.management.base import BaseCommand, CommandError

from issues.runner import reducer
from issues.runner.contract import ContractError

EXIT_REJECTED = 2


def dump(doc) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


class Command(BaseCommand):
    help = "Replay a PRP replay fixture and print its session snapshot (or --summary) as JSON."
    requires_system_checks = []  # pure: no models, no database

    def add_arguments(self, parser):
        parser.add_argument("fixture", help="Path to a paperclip.prp.fixture.v1 JSON file.")
        parser.add_argument("--summary", action="store_true", help="Print the parity summary instead.")

    def handle(self, *args, fixture: str, summary: bool, **options):
        try:
            with open(fixture, "rb") as handle:
                raw = handle.read()
        except OSError as exc:
            raise CommandError(f"Cannot read {fixture}: {exc.strerror or exc}")
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise CommandError(f"{fixture} is not JSON: {exc}")
        try:
            snapshot = reducer.replay_fixture(doc)
        except ContractError as exc:
            details = {"field": exc.field, "value": exc.value, "supported": exc.supported, **exc.as_details()}
            self.stderr.write(json.dumps({"error": exc.message, "code": exc.code, "details": details},
                                         ensure_ascii=False, default=str))
            sys.exit(EXIT_REJECTED)
        self.stdout.write(dump(reducer.parity_summary(snapshot) if summary else snapshot), ending="")
