"""Upload limits applied while a multipart body is parsed, before any view sees it.

Django streams an uploaded file to memory or a temporary file whatever its size; this handler
(first in FILE_UPLOAD_HANDLERS) stops keeping a file once it passes ``PAPERCLIP["ATTACHMENT_MAX_BYTES"]``,
so a huge upload costs no disk, and records the field on the request for the view to refuse with
the limit (:func:`oversized_fields`).
"""
from __future__ import annotations

from django.conf import settings
from django.core.files.uploadhandler import FileUploadHandler, SkipFile


class SizeLimitedUploadHandler(FileUploadHandler):
    def receive_data_chunk(self, raw_data, start):
        if start + len(raw_data) > settings.PAPERCLIP["ATTACHMENT_MAX_BYTES"]:
            oversized = getattr(self.request, "oversized_uploads", None)
            if oversized is None:
                oversized = self.request.oversized_uploads = []
            oversized.append(self.field_name)
            raise SkipFile()  # the rest of this file is read from the stream and dropped
        return raw_data

    def file_complete(self, file_size):
        return None  # the next handlers build the file


def oversized_fields(request) -> list[str]:
    """Fields whose file was dropped for size (``request``: Django's, or DRF's wrapping it)."""
    return list(getattr(getattr(request, "_request", request), "oversized_uploads", None) or [])
