"""The reference runner never sends a secret in a log line: the run key and secret-named
environment values are redacted before the line reaches the outbox."""
from prp_runner.redact import REDACTED, Redactor


def test_the_key_and_secret_named_values_are_redacted():
    redact = Redactor.for_run("pcp_run_key_0123456789", {"OPENAI_API_KEY": "sk-live-abcdefgh", "MODEL": "gpt-5-mini",
                                                         "GITHUB_TOKEN": "short"})
    line = "key=pcp_run_key_0123456789 openai=sk-live-abcdefgh model=gpt-5-mini token=short"
    assert redact(line) == f"key={REDACTED} openai={REDACTED} model=gpt-5-mini token=short"


def test_a_secret_containing_another_is_replaced_whole():
    redact = Redactor(["abcdefgh", "abcdefgh-ijklmnop"])
    assert redact("x abcdefgh-ijklmnop y abcdefgh") == f"x {REDACTED} y {REDACTED}"
