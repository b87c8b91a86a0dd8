"""The reference PRP runner: drives one Paperclip run over the runner protocol (``python -m prp_runner``)."""

RUNNER_VERSION = "1.0.0"
