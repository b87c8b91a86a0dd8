"""Uploaded files: a size limit applied while a multipart body is parsed, the one-file read the API
and the console share, and what every stored upload records (its shown name, type and SHA-256).

Django streams an uploaded file to memory or a temporary file whatever its size; this handler
(first in FILE_UPLOAD_HANDLERS, so it bounds every upload the server takes) stops keeping a file
once it passes ``PAPERCLIP["ATTACHMENT_MAX_BYTES"]``, so a huge upload costs no disk, and records
the field on the request; :func:`one_uploaded_file` then refuses it with the limit.
"""
from __future__ import annotations

import hashlib
import mimetypes

from django.conf import settings
from django.core.files.uploadhandler import FileUploadHandler, SkipFile

from .errors import InvalidInput, Unprocessable


GENERIC_TYPE = "application/octet-stream"
MAX_FILENAME = 255


def max_upload_bytes() -> int:
    return int(settings.PAPERCLIP["ATTACHMENT_MAX_BYTES"])


class SizeLimitedUploadHandler(FileUploadHandler):
    def receive_data_chunk(self, raw_data, start):
        if start + len(raw_data) > max_upload_bytes():
            oversized = getattr(self.request, "oversized_uploads", None)
            if oversized is None:
                oversized = self.request.oversized_uploads = []
            oversized.append(self.field_name)
            raise SkipFile()  # the rest of this file is read from the stream and dropped
        return raw_data

    def file_complete(self, file_size):
        return None  # the next handlers build the file


def too_large(field: str = "file") -> Unprocessable:
    """Upstream's answer for a file over the limit."""
    limit = max_upload_bytes()
    return Unprocessable(f"Attachment exceeds {limit} bytes", code="attachment_too_large",
                         details={field: [f"The limit is {limit} bytes."], "maxBytes": limit})


def one_uploaded_file(request, field: str = "file"):
    """The one file sent as ``field`` (``request``: Django's, or DRF's wrapping it). Reading the files
    parses the body, and only then is a file dropped for size known: 422 with the limit; none is
    upstream's 400 ``Missing file field '<field>'``; several are a 400 too."""
    files = request.FILES.getlist(field)
    if field in (getattr(getattr(request, "_request", request), "oversized_uploads", None) or ()):
        raise too_large(field)
    if not files:
        raise InvalidInput(f"Missing file field '{field}'", code="missing_file",
                           details={field: [f"Send the file as the multipart field '{field}'."]})
    if len(files) > 1:
        raise InvalidInput(details={field: ["Send one file per request."]})
    return files[0]


def content_type_of(declared: str | None, filename: str) -> str:
    """The part's declared type without parameters, lower-cased; a missing or generic one is
    guessed from the file name (curl and many clients send application/octet-stream)."""
    declared = (declared or "").split(";", 1)[0].strip().lower()
    if declared and declared != GENERIC_TYPE:
        return declared
    return (mimetypes.guess_type(filename, strict=False)[0] or GENERIC_TYPE).lower()


def clean_filename(name: str | None) -> str:
    """The name as shown back: its last path segment, without control characters, at most 255."""
    name = (name or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if ch.isprintable()).strip()
    if len(name) > MAX_FILENAME:  # keep the extension readers recognise the file by
        stem, dot, ext = name.rpartition(".")
        name = (stem[: MAX_FILENAME - len(ext) - 1] + dot + ext) if dot and len(ext) < 16 else name[:MAX_FILENAME]
    return name or "upload"


def sha256_of(upload) -> str:
    """The uploaded file's SHA-256 (hex), read in chunks; the file is left at its start."""
    digest = hashlib.sha256()
    for chunk in upload.chunks():
        digest.update(chunk)
    upload.seek(0)
    return digest.hexdigest()


def checked_upload(upload, *, noun: str, accepts, accepted: list[str], aliases: dict | None = None) -> tuple[str, str]:
    """Refuse an empty, oversized or unaccepted file before anything is locked or written (422, in
    upstream's words for ``noun``: "Attachment is empty", "Unsupported image type: <type>"); returns
    its shown name and its type (``aliases`` rename a type, e.g. image/jpg to image/jpeg)."""
    code = noun.lower()
    filename = clean_filename(getattr(upload, "name", ""))
    if not upload.size:
        raise Unprocessable(f"{noun} is empty", code=f"{code}_empty", details={"file": ["The file has no bytes."]})
    if upload.size > max_upload_bytes():
        raise too_large()
    content_type = content_type_of(getattr(upload, "content_type", None), filename)
    content_type = (aliases or {}).get(content_type, content_type)
    if not accepts(content_type):
        raise Unprocessable(f"Unsupported {code} type: {content_type}", code=f"{code}_type_unsupported",
                            details={"file": [f"'{content_type}' is not an accepted type."],
                                     "allowedTypes": list(accepted)})
    return filename, content_type
