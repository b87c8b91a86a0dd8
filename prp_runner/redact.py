"""Secrets never leave the runner in an event: the run's key, and the values of environment
variables whose names say they are secrets (the same rule the host's process adapter uses), are
replaced by ``[redacted]`` in every log line before it reaches the outbox."""
from __future__ import annotations

import re

REDACTED = "[redacted]"
MIN_SECRET_LENGTH = 8  # shorter values would redact ordinary words
SENSITIVE_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)


class Redactor:
    def __init__(self, secrets):
        # Longest first, so a secret that contains another is replaced whole.
        self._secrets = sorted({s for s in secrets if s and len(s) >= MIN_SECRET_LENGTH}, key=len, reverse=True)

    @classmethod
    def for_run(cls, key: str, environ) -> "Redactor":
        return cls([key, *(value for name, value in environ.items() if SENSITIVE_NAME.search(name))])

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text
