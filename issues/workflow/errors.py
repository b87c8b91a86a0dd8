"""The one error of workflow documents (its own module: the parser and the settings both raise it)."""


class PolicyInvalid(Exception):
    """A workflow document that cannot be used; ``code`` follows Symphony's error classes
    (``workflow_parse_error``, ``workflow_front_matter_not_a_map``, ``template_parse_error``) plus
    ``workflow_setting_invalid``, whose ``key`` names the setting (``agent.stall_timeout_ms``)."""

    def __init__(self, code: str, reason: str, *, key: str | None = None):
        super().__init__(f"{code}: {reason}")
        self.code, self.reason, self.key = code, reason, key
