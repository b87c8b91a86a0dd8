"""Lean SQL for the hot paths: rows read straight into model instances, and one-row inserts from a
statement built once per model.

The ORM compiles every queryset anew (joins, select list, converters, ordering) and a raw queryset
re-derives its column-to-field mapping from the cursor on every call; on a request that does little
else that is most of its CPU. These helpers keep what the ORM guarantees (the backend's and the
fields' value converters, ``from_db`` instances, ``pre_save`` and ``get_db_prep_save`` on insert) and
drop the per-call compilation. They run through Django's cursor, so query capture, the
``wrap_database_errors`` translation and ``on_commit`` bookkeeping behave as usual.

Use them where a statement runs on every request or every applied event; elsewhere the ORM reads
better.
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from functools import lru_cache

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models.constants import OnConflict

_CONSTANT = re.compile(r"[A-Za-z0-9_]+")


def constant(value: str) -> str:
    """A code constant (an enum value, never input) written into a statement as a SQL literal. Where
    a partial index's predicate names it (``status <> 'unlinked'``), the planner must see the value:
    a parameter hides it from the generic plan PostgreSQL caches for a prepared statement, which then
    cannot use the index and filters every row of the wider one instead."""
    if not _CONSTANT.fullmatch(value):
        raise ValueError(f"not a plain constant: {value!r}")
    return f"'{value}'"


@lru_cache(maxsize=None)
def _fields(model, exclude: tuple = ()) -> tuple:
    return tuple(f for f in model._meta.concrete_fields if f.attname not in exclude)


@lru_cache(maxsize=None)
def select_list(model, alias: str, exclude: tuple = ()) -> str:
    """``alias."col", …`` for the concrete fields of ``model`` (less the ``exclude`` attnames, left
    deferred), in ``_meta.concrete_fields`` order: the order :func:`load` expects."""
    qn = connections[DEFAULT_DB_ALIAS].ops.quote_name
    return ", ".join(f"{alias}.{qn(f.column)}" for f in _fields(model, exclude))


def pk_value(model, value, *, using: str = DEFAULT_DB_ALIAS):
    """``value`` as a parameter for ``model``'s primary key column (SQLite stores UUIDs as hex)."""
    return model._meta.pk.get_db_prep_value(value, connections[using])


def width(model, exclude: tuple = ()) -> int:
    """How many columns :func:`select_list` names (to split a joined row)."""
    return len(_fields(model, exclude))


@lru_cache(maxsize=None)
def _load_plan(model, alias: str, exclude: tuple) -> tuple:
    """(attnames, per column the (converter, expression) pairs the compiler would apply: the
    backend's, then the field's). SQLite needs them for UUIDs, datetimes and booleans; JSON fields
    everywhere."""
    connection = connections[alias]
    convs = []
    for field in _fields(model, exclude):
        col = field.get_col(model._meta.db_table)  # (a foreign key converts as its target field)
        convs.append(tuple((conv, col) for conv in
                           connection.ops.get_db_converters(col) + col.get_db_converters(connection)))
    return tuple(f.attname for f in _fields(model, exclude)), tuple(convs)


def load(model, values, *, exclude: tuple = (), using: str = DEFAULT_DB_ALIAS):
    """An instance of ``model`` from one row's values in :func:`select_list` order, as the ORM would
    build it (converted, ``exclude`` deferred, not ``adding``, bound to ``using``)."""
    connection = connections[using]
    names, converters = _load_plan(model, using, exclude)
    values = list(values)
    for i, convs in enumerate(converters):
        for conv, col in convs:
            values[i] = conv(values[i], col, connection)
    return model.from_db(using, names, values)


def fetch_one(model, sql: str, params, *, using: str = DEFAULT_DB_ALIAS):
    """Run ``sql`` (selecting :func:`select_list` of ``model``, then any extra columns) and return
    ``(instance, extras)`` for its first row, or ``(None, ())``."""
    row = fetch_row(sql, params, using=using)
    if row is None:
        return None, ()
    n = width(model)
    return load(model, row[:n], using=using), tuple(row[n:])


@contextmanager
def unprepared(*, using: str = DEFAULT_DB_ALIAS):
    """Statements run inside are planned afresh on every run: psycopg does not prepare them
    server-side (``DATABASE_PREPARE_THRESHOLD``). For a statement whose best plan depends on how big
    the rows it probes have grown: a prepared statement settles on a generic plan made once, and
    one made while a company had a handful of issues stays a scan of all of them as it grows. A
    no-op elsewhere (SQLite, client-side binding)."""
    connection = connections[using]
    connection.ensure_connection()
    raw = connection.connection
    threshold = getattr(raw, "prepare_threshold", None)
    if connection.vendor != "postgresql" or threshold is None:
        yield
        return
    raw.prepare_threshold = None
    try:
        yield
    finally:
        raw.prepare_threshold = threshold


def fetch_row(sql: str, params, *, using: str = DEFAULT_DB_ALIAS):
    """The first row ``sql`` returns, or None."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def fetch_rows(sql: str, params, *, using: str = DEFAULT_DB_ALIAS) -> list:
    """Every row ``sql`` returns."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def split(row, *models) -> list:
    """A joined row (each model's :func:`select_list` in turn; a model may be given as
    ``(model, exclude)``) as one instance per model."""
    out, at = [], 0
    for entry in models:
        model, exclude = entry if isinstance(entry, tuple) else (entry, ())
        n = width(model, exclude)
        out.append(load(model, row[at:at + n], exclude=exclude))
        at += n
    return out


def _pk_generated(model) -> bool:
    """Does the database give ``model``'s primary key (an auto field) rather than Python (a default)?"""
    pk = model._meta.pk
    return pk.get_default() is None and getattr(pk, "db_returning", False)


@lru_cache(maxsize=None)
def insert_fields(model) -> tuple:
    """The fields an INSERT of ``model`` names: every concrete field but a database-generated key."""
    generated = _pk_generated(model)
    return tuple(f for f in model._meta.concrete_fields if not (generated and f.primary_key))


def _placeholders(fields) -> str:
    """``(%s, %s, …)``: one row's values."""
    return f"({', '.join(['%s'] * len(fields))})"


def _insert_into(model, alias: str, on_conflict=None) -> str:
    """``INSERT INTO t (the insert_fields' columns) VALUES `` (the rows follow)."""
    connection = connections[alias]
    qn = connection.ops.quote_name
    return (f"{connection.ops.insert_statement(on_conflict=on_conflict)} {qn(model._meta.db_table)} "
            f"({', '.join(qn(f.column) for f in insert_fields(model))}) VALUES ")


@lru_cache(maxsize=None)
def _insert_plan(model, alias: str, skip_conflicts: bool) -> tuple:
    """(sql, fields, generated) of a one-row INSERT of ``model`` (:func:`insert_fields`; a
    database-generated primary key is returned). ``skip_conflicts``: a row a unique constraint
    refuses is not inserted (and returns nothing), as ``bulk_create(ignore_conflicts=True)``."""
    connection = connections[alias]
    qn = connection.ops.quote_name
    pk = model._meta.pk
    generated = _pk_generated(model)
    if (generated or skip_conflicts) and not connection.features.can_return_columns_from_insert:
        raise NotImplementedError(f"{connection.vendor} cannot return columns from an INSERT")
    fields = insert_fields(model)
    on_conflict = OnConflict.IGNORE if skip_conflicts else None
    sql = _insert_into(model, alias, on_conflict) + _placeholders(fields)
    suffix = connection.ops.on_conflict_suffix_sql(fields, on_conflict, None, None) if skip_conflicts else ""
    if suffix:
        sql += f" {suffix}"
    if generated or skip_conflicts:
        sql += f" RETURNING {qn(pk.column)}"
    return sql, fields, generated


def insert(obj, *, using: str = DEFAULT_DB_ALIAS, skip_conflicts: bool = False):
    """Insert ``obj`` as ``obj.save()`` would for a new row (``pre_save`` for auto_now fields,
    ``get_db_prep_save`` for every value; no signals: use it for models nobody listens to) and
    return it saved, its generated primary key set. With ``skip_conflicts`` a row that a unique
    constraint refuses is not written and None is returned (no savepoint needed)."""
    model = type(obj)
    connection = connections[using]
    sql, fields, generated = _insert_plan(model, using, skip_conflicts)
    obj._prepare_related_fields_for_save(operation_name="insert")  # as save(): no unsaved related object
    params = [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone() if generated or skip_conflicts else ()
    if row is None:
        return None  # skipped: the constraint kept the row that was there
    if generated:
        setattr(obj, model._meta.pk.attname, row[0])
    obj._state.adding, obj._state.db = False, using
    return obj


@lru_cache(maxsize=None)
def _insert_select_plan(model, alias: str, source: str, computed: tuple) -> tuple:
    qn = connections[alias].ops.quote_name
    expressions = dict(computed)
    fields = insert_fields(model)
    select = ", ".join(expressions.get(f.attname, "%s") for f in fields)
    sql = (f"INSERT INTO {qn(model._meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) "
           f"SELECT {select} FROM {source}")
    return sql, tuple(f for f in fields if f.attname not in expressions)


def insert_select(obj, source: str, computed: dict, *, using: str = DEFAULT_DB_ALIAS) -> tuple[str, list]:
    """(sql, params) of ``INSERT INTO t (…) SELECT … FROM source``: ``obj``'s row as :func:`insert`
    would write it, one per row of ``source``, except the columns in ``computed`` (attname -> SQL
    over ``source``). For a data-modifying CTE that writes a row another statement's result decides
    (PostgreSQL). Returns nothing; ``obj`` is not marked saved (its key is never read back)."""
    connection = connections[using]
    sql, fields = _insert_select_plan(type(obj), using, source, tuple(sorted(computed.items())))
    obj._prepare_related_fields_for_save(operation_name="insert")
    return sql, [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]


def insert_many(objs, *, using: str = DEFAULT_DB_ALIAS) -> None:
    """Insert new rows of one model in one statement, as :func:`insert` would one by one, except that
    a value already set on an ``auto_now``/``auto_now_add`` field is kept (rows collected over a
    while keep the time they were made). Generated keys are not read back."""
    if not objs:
        return
    model = type(objs[0])
    connection = connections[using]
    fields = insert_fields(model)
    sql = _insert_into(model, using) + ", ".join([_placeholders(fields)] * len(objs))
    params = []
    for obj in objs:
        obj._prepare_related_fields_for_save(operation_name="insert")
        for f in fields:
            value = getattr(obj, f.attname)
            params.append(f.get_db_prep_save(f.pre_save(obj, True) if value is None else value, connection))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
    for obj in objs:
        obj._state.adding, obj._state.db = False, using


@lru_cache(maxsize=None)
def _update_sql(model, alias: str, names: tuple) -> tuple:
    connection = connections[alias]
    qn = connection.ops.quote_name
    fields = tuple(model._meta.get_field(name) for name in names)
    sql = (f"UPDATE {qn(model._meta.db_table)} SET {', '.join(f'{qn(f.column)} = %s' for f in fields)} "
           f"WHERE {qn(model._meta.pk.column)} = %s")
    return sql, fields


def _update_params(obj, fields, connection) -> list:
    return ([f.get_db_prep_save(f.pre_save(obj, False), connection) for f in fields]
            + [type(obj)._meta.pk.get_db_prep_value(obj.pk, connection)])


def update_fields(obj, names, *, using: str = DEFAULT_DB_ALIAS) -> int:
    """``obj.save(update_fields=names)`` for a saved row (``pre_save`` for each named field, so a named
    ``auto_now`` field is bumped; ``get_db_prep_save`` for every value; no signals: use it for models
    nobody listens to), from a statement built once per model and field list. Returns the rows
    updated."""
    connection = connections[using]
    sql, fields = _update_sql(type(obj), using, tuple(names))
    with connection.cursor() as cursor:
        cursor.execute(sql, _update_params(obj, fields, connection))
        return cursor.rowcount


def update_many(objs, names, *, using: str = DEFAULT_DB_ALIAS) -> None:
    """:func:`update_fields` for several saved rows of one model, sent as one ``executemany`` (psycopg
    pipelines it: one round trip)."""
    if not objs:
        return
    connection = connections[using]
    sql, fields = _update_sql(type(objs[0]), using, tuple(names))
    with connection.cursor() as cursor:
        cursor.executemany(sql, [_update_params(obj, fields, connection) for obj in objs])
