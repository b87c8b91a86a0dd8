from django.core.management import call_command


def test_openapi_schema_validates_without_warnings(tmp_path):
    """The published schema is valid OpenAPI and drf-spectacular raises no warnings."""
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"))
    assert "/api/issues/{issue_id}/checkout" in (tmp_path / "schema.yaml").read_text()
