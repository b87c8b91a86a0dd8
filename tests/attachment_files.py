"""Files for the attachment tests, and what the attachments storage holds for an issue (a temporary
folder per test session, tests/conftest.py)."""
from django.core.files.uploadedfile import SimpleUploadedFile

from issues.models.attachment import attachment_storage

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4  # 1,032 bytes


def a_file(name="shot.png", content=PNG, content_type="image/png"):
    return SimpleUploadedFile(name, content, content_type=content_type)


def stored_keys(issue) -> set[str]:
    """The object keys in storage under this issue's folder."""
    storage = attachment_storage()
    folder = f"{issue.company_id}/issues/{issue.pk}"
    if not storage.exists(folder):
        return set()
    return {f"{folder}/{name}" for name in storage.listdir(folder)[1]}
