"""Same-length edits behind the ORM are caught by the bounded case reads on SQLite as on
PostgreSQL: the snapshot binds an md5 of the paged text that the database computes in the
statement that cuts the page (PostgreSQL ``md5()``, SQLite the ``paperclip_md5`` aggregate)."""
import hashlib
import json

import pytest
from django.db import connection

from cases import sqlite_digest
from cases.models import Case
from cases.reading import sql_window
from issues.actors import SYSTEM
from issues.models import DocumentRevision, Issue
from issues.services.thread import document_write
from tests.conftest import is_postgres
from tests.test_case_reads import MULTI, assert_stale, continue_read, first_page, make_case, read

pytestmark = pytest.mark.django_db


def raw_update(model, column, pk, value, *, json_value=False):
    """An UPDATE behind the ORM: no ``updated_at``, no revision, no signal."""
    qn = connection.ops.quote_name
    cast = "::jsonb" if json_value and is_postgres() else ""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {qn(model._meta.db_table)} SET {qn(column)} = %s{cast} WHERE id = %s",
                       [value, model._meta.pk.get_db_prep_value(pk, connection)])
        assert cursor.rowcount == 1


def db_text(model, column, pk, *, json_value=False) -> bytes:
    qn = connection.ops.quote_name
    expr = f"{qn(column)}::text" if json_value and is_postgres() else qn(column)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {expr} FROM {qn(model._meta.db_table)} WHERE id = %s",
                       [model._meta.pk.get_db_prep_value(pk, connection)])
        return cursor.fetchone()[0].encode("utf-8")


@pytest.mark.parametrize("section", [None, "fields"])
def test_same_length_fields_edit_behind_the_orm_is_409(board_client, cases_company, section):
    case = make_case(cases_company, fields={"v": "a" * 500})
    params = {"section": section} if section else {}
    data = first_page(board_client, case, **params)
    before = db_text(Case, "fields", case.pk, json_value=True)
    raw_update(Case, "fields", case.pk, json.dumps({"v": "b" * 500}), json_value=True)
    after = db_text(Case, "fields", case.pk, json_value=True)
    assert len(after) == len(before) and after != before
    assert Case.objects.get(pk=case.pk).updated_at == case.updated_at  # nothing but the content moved
    assert_stale(continue_read(board_client, case, data, **params), "case")
    restart = first_page(board_client, case, **params)  # restarting works and reads the new content
    if section == "fields":
        assert restart["readPage"]["text"].startswith('{"v": "bbbb')


def test_same_length_document_edit_behind_the_orm_is_409(board_client, cases_company):
    body = ("# Procedure " + MULTI + "\n") * 20
    case = make_case(cases_company, workflow_text=body)
    params = {"section": "document", "documentKey": "workflow", "documentIssueId": str(case.primary_task_id)}
    data = first_page(board_client, case, **params)
    revision_id = data["document"]["revisionId"]
    edited = body.replace("Procedure", "Prozedure")
    assert len(edited.encode()) == len(body.encode())
    raw_update(DocumentRevision, "body", revision_id, edited)
    assert_stale(continue_read(board_client, case, data, **params), "document")
    # Restarting reads the edited body, still the same revision.
    restart = read(board_client, case, offsetBytes=0, limitBytes=4096, **params).json()
    assert restart["readPage"]["text"] == edited and restart["document"]["revisionId"] == revision_id


def test_an_edit_past_the_first_digest_chunk_is_caught(board_client, cases_company):
    """The SQLite digest hashes every chunk of the value, not only the first one."""
    filler = "x" * (sqlite_digest.CHUNK_BYTES * 2 + 1000)
    case = make_case(cases_company, fields={"a": filler, "z": "tail"})
    data = first_page(board_client, case, section="fields")
    raw_update(Case, "fields", case.pk, json.dumps({"a": filler, "z": "TAIL"}), json_value=True)
    assert_stale(continue_read(board_client, case, data, section="fields"), "case")


@pytest.mark.parametrize("size", [0, 1, sqlite_digest.CHUNK_BYTES - 1, sqlite_digest.CHUNK_BYTES,
                                  sqlite_digest.CHUNK_BYTES + 1, 3 * sqlite_digest.CHUNK_BYTES + 17])
def test_the_database_digest_is_the_md5_of_the_texts_utf8_bytes(cases_company, size):
    """Both databases answer the same digest: the md5 of the text's UTF-8 bytes, at every size."""
    case = make_case(cases_company)
    task = Issue.objects.get(pk=case.primary_task_id)
    body = (MULTI * (size // 10 + 1)).encode()[:size].decode("utf-8", "ignore")
    revision = document_write(actor=SYSTEM, issue=task, key="notes", body=body)
    window = sql_window(DocumentRevision, "body", revision.pk, 0, 16)
    raw = body.encode()
    assert window.total == len(raw) and window.data == raw[:16]
    assert window.digest == hashlib.md5(raw).hexdigest()
