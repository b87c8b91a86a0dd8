"""The PRP contract: the JSON Schemas of ``schemas/`` compiled once, and validation that fails closed.

Every document a runner sends (event envelopes, capability snapshots) and every replay fixture goes
through a ``validate_*`` function here first. In order:

1. Versions fail closed. A required version (an event's ``schemaVersion``, a fixture's
   ``protocolVersion`` / ``fixtureVersion``) outside the supported set is ``unsupported_required_version``;
   an unknown ``schema`` discriminator (``paperclip.prp.event.v3``, ``…capabilities.v9``, or nested, e.g.
   a payload's ``paperclip.prp.terminal.v2``) is ``unsupported_required_schema``; both name the field,
   the value and what is supported. A document newer than the run's negotiated version is refused
   the same way, naming what the run accepts: ``schemaVersion`` 2 on a v1 run is
   ``unsupported_required_version`` (supported ``[1]``); a v2 ``schema`` of an event, command or
   capability snapshot on a v1 run is ``unsupported_required_schema`` (supported: the v1 name).
   Older documents stay valid on newer runs (a v2 run accepts v1 events).
2. Host storage rules: no NaN/Infinity, no NUL and no unpaired surrogate in any string or key
   (PostgreSQL's jsonb cannot store them; refusing here gives a JSON path, not a database error).
3. Draft 2020-12 validation (``jsonschema``). The most relevant error (``best_match``) becomes
   ``schema_invalid`` with its JSON path as ``field``; for a missing member, or an unknown member of
   a closed object, the path names that member (``$.payload.token``).

Validation never changes the document: unknown optional members of extensible objects stay, and the
caller stores the envelope as received.

Host additions (in code; the schema files stay upstream's plus the two seed events, see
``schemas/SOURCES.md``): ``pattern`` uses ECMA-262's ``$`` (end of input; Python's ``$`` also matches
before a final newline, which would let ``"id\n"`` through every id pattern); ``format: date-time``
is asserted (RFC 3339, a small checker, no extra dependency); the payloads the host projects are
bound for both event versions: ``usage.reported`` → ``usage.schema.json`` (closed), ``run.terminal`` →
``terminal.schema.json`` and ``run.result.proposed`` → ``result.schema.json`` (upstream binds these in
v1 only), ``runtime_request.*`` → ``payload.request`` against ``request.schema.json`` (required for
``created``).

``$ref`` resolves through a ``referencing.Registry`` of the local files only, keyed by ``$id``; its
retrieve hook refuses every other URI (nothing is fetched), and every ``$ref`` of every file is
resolved when the contract is built, so a missing file fails at start-up, not mid-request.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import threading
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from jsonschema import Draft202012Validator, FormatChecker, ValidationError, validators
from jsonschema.exceptions import best_match
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable
from referencing.jsonschema import DRAFT202012

SUPPORTED_VERSIONS = (1, 2)
FIXTURE_VERSIONS = (1,)
SCHEMA_DIR = Path(__file__).with_name("schemas")

_V1 = "https://paperclip.dev/schemas/prp/v1/"
_V2 = "https://paperclip.dev/schemas/prp/v2/"
EVENT_SCHEMAS = {1: "paperclip.prp.event.v1", 2: "paperclip.prp.event.v2"}
COMMAND_SCHEMAS = {1: "paperclip.prp.command.v1", 2: "paperclip.prp.command.v2"}
CAPABILITIES_SCHEMAS = {1: "paperclip.prp.capabilities.v1", 2: "paperclip.prp.capabilities.v2"}
FIXTURE_SCHEMA = "paperclip.prp.fixture.v1"
NATIVE_EXECUTION_SCHEMA = "paperclip-runner/native-execution/v1"

_URIS = {
    "event": {1: _V1 + "event.schema.json", 2: _V2 + "event.schema.json"},
    "command": {1: _V1 + "command.schema.json", 2: _V2 + "command.schema.json"},
    "capabilities": {1: _V1 + "capabilities.schema.json", 2: _V2 + "capabilities.schema.json"},
}
_FIXTURE_URI = _V1 + "fixture.schema.json"
_RESULT_URI = _V1 + "result.schema.json"
_TERMINAL_URI = _V1 + "terminal.schema.json"
_REQUEST_URI = _V1 + "request.schema.json"
_USAGE_URI = _V1 + "usage.schema.json"
_NATIVE_URI = "https://paperclip.dev/schemas/runner/native-execution/v1.json"
_HOST_EVENT_URI = "urn:paperclip:host:prp:event:v{}"
_DIALECT = "https://json-schema.org/draft/2020-12/schema"

UNSUPPORTED_VERSION = "unsupported_required_version"
UNSUPPORTED_SCHEMA = "unsupported_required_schema"
SCHEMA_INVALID = "schema_invalid"
_MISSING = object()


class ContractError(Exception):
    """A document refused by the contract; ``as_details()`` is the API error's ``details``."""

    def __init__(self, code, message, *, field="$", value=_MISSING, supported=None, keyword=None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.has_value = value is not _MISSING
        self.value = None if value is _MISSING else value
        self.supported = list(supported) if supported is not None else None
        self.keyword = keyword  # the JSON Schema keyword that failed (schema_invalid only)

    def as_details(self) -> dict:
        # The field path is also a key holding the reason, like a form error, so the project's
        # error helpers (tests.test_errors.assert_error fields=…) can name it.
        details = {"field": self.field, "reason": self.message, self.field: [self.message]}
        if self.has_value:
            details["value"] = self.value
        if self.supported is not None:
            details["supported"] = list(self.supported)
        if self.keyword:
            details["keyword"] = self.keyword
        return details

    def prefixed(self, at: str) -> "ContractError":
        """The same error with its field moved under ``at`` (e.g. ``$.events[2]``)."""
        if at == "$":
            return self
        err = ContractError(self.code, self.message, field=_join(at, self.field),
                            supported=self.supported, keyword=self.keyword)
        err.has_value, err.value = self.has_value, self.value
        return err


# ---------------------------------------------------------------- canonical JSON

def whole_numbers(doc):
    """``doc`` with every float that holds a whole number (exactly, below 2**53) as an int: RFC 8785
    writes ``1.0`` and ``1e2`` as ``1`` and ``100``. (The reference runner's outbox writes the same
    form, prp_runner.canonical: the runner package does not import the host.)"""
    if isinstance(doc, float) and doc.is_integer() and abs(doc) < 2 ** 53:
        return int(doc)
    if isinstance(doc, dict):
        return {key: whole_numbers(value) for key, value in doc.items()}
    if isinstance(doc, list):
        return [whole_numbers(value) for value in doc]
    return doc


def canonical_json(doc) -> bytes:
    """Sorted keys, no whitespace, UTF-8 (not ASCII-escaped); NaN/Infinity refused; a whole number
    is one form however it was written (:func:`whole_numbers`).

    It compares a redelivered envelope with the stored one (SOURCES.md: byte-identical canonical
    JSON), so a runner whose serialiser writes ``1`` on a retry after ``1.0`` is not refused.
    """
    try:
        text = json.dumps(whole_numbers(doc), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ContractError(SCHEMA_INVALID, "Strings must be valid Unicode (unpaired surrogate).") from exc
    except ValueError as exc:  # allow_nan=False
        raise ContractError(SCHEMA_INVALID, f"Not representable as JSON: {exc}.") from exc


def digest(doc) -> str:
    """sha256 hex of :func:`canonical_json`."""
    return hashlib.sha256(canonical_json(doc)).hexdigest()


# ---------------------------------------------------------------- paths

def _child(path: str, key) -> str:
    # Same rendering as jsonschema's ValidationError.json_path.
    return f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}"


def _join(at: str, path: str) -> str:
    return at + path[1:] if path.startswith("$") else f"{at}.{path}"


# ---------------------------------------------------------------- the compiled contract

_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?(?:[Zz]|[+-](\d{2}):(\d{2}))", re.ASCII)


def _is_date_time(value) -> bool:
    if not isinstance(value, str):
        return True
    m = _RFC3339.fullmatch(value)
    if m is None:
        return False
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    if second > 60 or int(m.group(8) or 0) > 23 or int(m.group(9) or 0) > 59:
        return False
    try:
        return bool(datetime(year, month, day, hour, minute, min(second, 59)))  # 60: a leap second
    except ValueError:
        return False


FORMAT_CHECKER = FormatChecker(formats=())
FORMAT_CHECKER.checks("date-time")(_is_date_time)


@lru_cache(maxsize=256)
def _ecma_regex(pattern: str) -> re.Pattern:
    """Compile a schema pattern with ECMA-262's ``$`` (end of input only): ``$`` outside a class → ``\\Z``."""
    out, in_class, i = [], False, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "$":
            ch = r"\Z"
        out.append(ch)
        i += 1
    return re.compile("".join(out))


def _pattern(validator, pattern, instance, schema):
    if validator.is_type(instance, "string") and not _ecma_regex(pattern).search(instance):
        yield ValidationError(f"{_short(instance)} does not match {pattern!r}")


_Validator = validators.extend(Draft202012Validator, {"pattern": _pattern})


def _refuse_retrieval(uri: str):
    # The registry's only retrieve hook: nothing outside schemas/ exists, and nothing is fetched.
    raise NoSuchResource(ref=uri)


def _bind(event_type: str, payload_schema: dict) -> dict:
    return {"if": {"properties": {"eventType": {"const": event_type}}, "required": ["eventType"]},
            "then": {"properties": {"payload": payload_schema}}}


def _host_bindings() -> list:
    request = {"$ref": _REQUEST_URI}
    return [
        _bind("usage.reported", {"$ref": _USAGE_URI}),
        _bind("run.terminal", {"$ref": _TERMINAL_URI}),
        _bind("run.result.proposed", {"$ref": _RESULT_URI}),
        _bind("runtime_request.created", {"type": "object", "required": ["request"], "properties": {"request": request}}),
    ] + [_bind(f"runtime_request.{s}", {"type": "object", "properties": {"request": request}})
         for s in ("resolved", "expired", "cancelled")]


def _host_uri(version: int, event_type: str | None = None) -> str:
    base = _HOST_EVENT_URI.format(version)
    return base if event_type is None else f"{base}:{event_type}"


def _branch_applies(branch, event_type: str) -> bool:
    """Whether an ``allOf`` branch ``{"if": {eventType const/enum}, "then": …}`` can apply to ``event_type``."""
    cond = branch.get("if") if isinstance(branch, dict) and set(branch) <= {"if", "then"} else None
    cond = cond.get("properties", {}).get("eventType") if isinstance(cond, dict) else None
    if isinstance(cond, dict) and set(cond) == {"const"}:
        return cond["const"] == event_type
    if isinstance(cond, dict) and set(cond) == {"enum"}:
        return event_type in cond["enum"]
    return True  # not an eventType switch: always kept


def _host_event_docs(event_doc: dict, version: int) -> dict:
    """The event schema plus the host bindings: whole, and one copy per ``eventType`` keeping only the
    ``if``/``then`` branches that can apply to it. Same verdicts (the whole one serves envelopes without
    a known ``eventType``); about ten times faster, since Python's jsonschema otherwise tries ~30 ``if``s.
    """
    if any(ref.startswith("#") for ref in _walk_refs(event_doc)):
        raise RuntimeError(f"{event_doc['$id']}: host copies need absolute $refs")
    branches = list(event_doc.get("allOf", [])) + _host_bindings()
    docs = {_host_uri(version): {**event_doc, "$id": _host_uri(version), "allOf": branches}}
    for event_type in event_doc["properties"]["eventType"]["enum"]:
        uri = _host_uri(version, event_type)
        docs[uri] = {**event_doc, "$id": uri, "allOf": [b for b in branches if _branch_applies(b, event_type)]}
    return docs


def _objects(node):
    """Every JSON object inside ``node``, depth first."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _walk_refs(node):
    return [obj["$ref"] for obj in _objects(node) if isinstance(obj.get("$ref"), str)]


def _discriminators(docs) -> dict:
    """``schema`` const of every object the schemas describe -> its ``schemaVersion`` const (or None)."""
    found = {}
    for obj in _objects(list(docs)):
        props = obj.get("properties")
        name = props.get("schema") if isinstance(props, dict) else None
        if isinstance(name, dict) and isinstance(name.get("const"), str):
            version = props.get("schemaVersion")
            found.setdefault(name["const"], version.get("const") if isinstance(version, dict) else None)
    return found


_FAMILY = re.compile(r"(.+?)[./]v\d+")


def _family(name: str):
    m = _FAMILY.fullmatch(name)
    return m.group(1) if m else None


class _Contract:
    """Registry and validators, built once per process (see :func:`_contract`)."""

    def __init__(self, schema_dir: Path = SCHEMA_DIR):
        docs = {}
        for path in sorted(schema_dir.glob("*.json")):
            doc = json.loads(path.read_text(encoding="utf-8"))
            uri = doc.get("$id")
            if not isinstance(uri, str) or uri in docs:
                raise RuntimeError(f"{path.name}: missing or duplicate $id {uri!r}")
            # All files are 2020-12. The in-memory copy drops "$schema": jsonschema would otherwise
            # switch to its stock class at each $ref into a file and lose the ECMA ``pattern`` above.
            if doc.pop("$schema", _DIALECT) != _DIALECT:
                raise RuntimeError(f"{path.name}: only JSON Schema draft 2020-12 is supported")
            docs[uri] = doc
        checked = list(docs) + [_host_uri(v) for v in SUPPORTED_VERSIONS]  # the per-type copies are subsets
        for version in SUPPORTED_VERSIONS:
            docs.update(_host_event_docs(docs[_URIS["event"][version]], version))
        self.registry = Registry(retrieve=_refuse_retrieval).with_resources(
            (uri, DRAFT202012.create_resource(doc)) for uri, doc in docs.items()).crawl()
        for uri in checked:  # every $ref resolves now, or the contract does not load
            doc = docs[uri]
            resolver = self.registry.resolver(base_uri=uri)
            for ref in _walk_refs(doc):
                try:
                    resolver.lookup(ref)
                except Unresolvable as exc:
                    raise RuntimeError(f"schema {uri}: $ref {ref!r} does not resolve") from exc
        self.validators = {uri: _Validator(doc, registry=self.registry, format_checker=FORMAT_CHECKER)
                           for uri, doc in docs.items()}
        self.discriminators = _discriminators(docs.values())
        self.families = {}  # e.g. "paperclip.prp.terminal" -> ["paperclip.prp.terminal.v1"]
        for name in self.discriminators:
            if _family(name):
                self.families.setdefault(_family(name), []).append(name)

    def event_uri(self, version: int, envelope: dict) -> str:
        specialised = _host_uri(version, envelope.get("eventType")) if isinstance(envelope.get("eventType"), str) else None
        return specialised if specialised in self.validators else _host_uri(version)

    def check(self, uri: str, doc, at: str) -> None:
        error = best_match(self.validators[uri].iter_errors(doc))
        if error is not None:
            raise _schema_error(error, at)


_LOCK = threading.Lock()
_INSTANCE = None


def _contract() -> _Contract:
    """The compiled contract (lazy, once per process)."""
    global _INSTANCE
    if _INSTANCE is None:
        with _LOCK:
            if _INSTANCE is None:
                _INSTANCE = _Contract()
    return _INSTANCE


def schema_registry() -> Registry:
    """The local-only registry (for tests and tools that compile an ad-hoc schema against it)."""
    return _contract().registry


# ---------------------------------------------------------------- errors

def _short(value, limit=120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _scalar(value) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _schema_error(error: ValidationError, at: str) -> ContractError:
    path, keyword, instance = error.json_path, error.validator, error.instance
    value = _MISSING
    if keyword == "required" and isinstance(instance, dict):
        missing = next((n for n in error.validator_value if n not in instance), None)
        if missing is not None:
            path, reason = _child(path, missing), f"'{missing}' is required."
        else:
            reason = error.message
    elif keyword in ("additionalProperties", "unevaluatedProperties") and isinstance(instance, dict):
        known = error.schema.get("properties", {})
        extra = next((k for k in instance if k not in known), None)
        if extra is not None:
            path, reason = _child(path, extra), f"'{extra}' is not allowed here (closed object)."
        else:
            reason = error.message
    else:
        reason = error.message
        if _scalar(instance):
            value = instance[:200] if isinstance(instance, str) else instance
    if len(reason) > 300:
        reason = reason[:300] + "…"
    return ContractError(SCHEMA_INVALID, reason, field=_join(at, path), value=value, keyword=keyword)


def _invalid(field, reason, value=_MISSING):
    return ContractError(SCHEMA_INVALID, reason, field=field, value=value)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _negotiated(protocol_version) -> int:
    if not _is_int(protocol_version) or protocol_version not in SUPPORTED_VERSIONS:
        raise ValueError(f"protocol_version must be one of {SUPPORTED_VERSIONS}, got {protocol_version!r}")
    return protocol_version


def _object(doc, at, what):
    if not isinstance(doc, dict):
        raise _invalid(at, f"A {what} must be a JSON object.")


def _required_version(doc, key, supported, at, what):
    """A required integer version member in ``supported``; returns it."""
    field = _child(at, key)
    value = doc.get(key, _MISSING)
    if value is _MISSING:
        raise _invalid(field, f"'{key}' is required.")
    if not _is_int(value):
        raise _invalid(field, f"'{key}' must be an integer.", value if _scalar(value) else _MISSING)
    if value not in supported:
        raise ContractError(UNSUPPORTED_VERSION, f"{what} {key} {value} is not supported (supported: {list(supported)}).",
                            field=field, value=value, supported=supported)
    return value


def _discriminator(doc, names_by_version: dict, protocol_version, at, what):
    """The ``schema`` member: one of ``names_by_version`` and not newer than the run; returns its version."""
    field = _child(at, "schema")
    name = doc.get("schema", _MISSING)
    if name is _MISSING:
        raise _invalid(field, "'schema' is required.")
    if not isinstance(name, str):
        raise _invalid(field, "'schema' must be a string.", name if _scalar(name) else _MISSING)
    version = next((v for v, n in names_by_version.items() if n == name), None)
    if version is None:
        raise ContractError(UNSUPPORTED_SCHEMA, f"{what} schema {_short(name)} is not supported.",
                            field=field, value=name, supported=list(names_by_version.values()))
    if protocol_version is not None and version > protocol_version:
        allowed = [n for v, n in names_by_version.items() if v <= protocol_version]
        raise ContractError(UNSUPPORTED_SCHEMA, f"{what} schema {name} is newer than the run's negotiated "
                            f"protocol version {protocol_version}.", field=field, value=name, supported=allowed)
    return version


_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")


def _bad_text(text: str) -> bool:
    return "\x00" in text or (not text.isascii() and _BAD_TEXT.search(text) is not None)


def _scan(node, path, free_form=(), check_root=False):
    """Host storage rules everywhere, and nested discriminators except under the root's ``free_form``
    members; the root's own ``schema`` only with ``check_root`` (the others check it first themselves)."""
    contract = _contract()
    stack = [(node, path, True)]
    while stack:
        value, where, typed = stack.pop()
        if isinstance(value, dict):
            name = value.get("schema")
            if typed and isinstance(name, str) and (check_root or where != path):
                _check_nested_schema(contract, value, name, where)
            for key, item in value.items():
                if _bad_text(key):
                    raise _invalid(where, "Member names must not contain NUL or unpaired surrogates.")
                stack.append((item, _child(where, key), typed and not (where == path and key in free_form)))
        elif isinstance(value, list):
            stack.extend((item, _child(where, i), typed) for i, item in enumerate(value))
        elif isinstance(value, str):
            if _bad_text(value):
                raise _invalid(where, "Strings must not contain NUL or unpaired surrogates (not storable).")
        elif isinstance(value, float) and not math.isfinite(value):
            raise _invalid(where, "NaN and Infinity are not JSON numbers.")


def check_storable(doc, at: str = "$") -> None:
    """Only the storage rules (no NUL, no unpaired surrogate, finite numbers), for free-form
    runner documents the host keeps without a schema: hello identity, command results."""
    _scan(doc, at, free_form=tuple(doc) if isinstance(doc, dict) else ())


def _check_nested_schema(contract, obj, name, where):
    """A nested ``schema`` of a PRP family (``paperclip.prp.terminal.v*``…) must be a known one, and its
    ``schemaVersion`` (where the family has one) a known version; other ``schema`` strings are data."""
    names = contract.families.get(_family(name)) or ([name] if name in contract.discriminators else [])
    if not names:
        return
    versions = sorted({contract.discriminators[n] for n in names if contract.discriminators[n] is not None})
    version = obj.get("schemaVersion", _MISSING)
    if versions and _is_int(version) and version not in versions:  # checked first, as upstream does
        raise ContractError(UNSUPPORTED_VERSION, f"{name} schemaVersion {version} is not supported.",
                            field=_child(where, "schemaVersion"), value=version, supported=versions)
    if name not in contract.discriminators:
        raise ContractError(UNSUPPORTED_SCHEMA, f"Schema {_short(name)} is not supported.",
                            field=_child(where, "schema"), value=name, supported=sorted(names))


# ---------------------------------------------------------------- public validators

def _precheck_event(envelope, protocol_version, at) -> int:
    _object(envelope, at, "PRP event")
    allowed = [v for v in SUPPORTED_VERSIONS if v <= protocol_version]
    version = _required_version(envelope, "schemaVersion", SUPPORTED_VERSIONS, at, "Event")
    if version > protocol_version:
        raise ContractError(UNSUPPORTED_VERSION, f"Event schemaVersion {version} is newer than the run's "
                            f"negotiated protocol version {protocol_version}.",
                            field=_child(at, "schemaVersion"), value=version, supported=allowed)
    _discriminator(envelope, EVENT_SCHEMAS, protocol_version, at, "Event")
    _scan(envelope, at, free_form=("debug",))  # debug is provider data: stored, never interpreted
    return version


def validate_event(envelope, *, protocol_version: int, at: str = "$") -> None:
    """A runner → host event envelope on a run that negotiated ``protocol_version``."""
    version = _precheck_event(envelope, _negotiated(protocol_version), at)
    contract = _contract()
    contract.check(contract.event_uri(version, envelope), envelope, at)


def _precheck_versioned(doc, names, protocol_version, at, what) -> int:
    _object(doc, at, what)
    version = _discriminator(doc, names, protocol_version, at, what)
    _scan(doc, at)
    return version


def validate_command(doc, *, protocol_version: int, at: str = "$") -> None:
    """A host → runner command (``paperclip.prp.command.v1|v2``), not newer than the run."""
    version = _precheck_versioned(doc, COMMAND_SCHEMAS, _negotiated(protocol_version), at, "Command")
    _contract().check(_URIS["command"][version], doc, at)


def validate_capabilities(doc, *, protocol_version: int, at: str = "$") -> None:
    """A capability snapshot (``paperclip.prp.capabilities.v1|v2``), not newer than the run."""
    version = _precheck_versioned(doc, CAPABILITIES_SCHEMAS, _negotiated(protocol_version), at, "Capabilities")
    _contract().check(_URIS["capabilities"][version], doc, at)


def _validate_payload(uri, doc, at, what):
    _object(doc, at, what)
    _scan(doc, at, check_root=True)
    _contract().check(uri, doc, at)


def validate_result(doc, *, at: str = "$") -> None:
    """A structured run result (``paperclip.run_result.v1``, the ``run.result.proposed`` payload)."""
    _validate_payload(_RESULT_URI, doc, at, "run result")


def validate_terminal(doc, *, at: str = "$") -> None:
    """A terminal state (``paperclip.prp.terminal.v1``, the ``run.terminal`` payload)."""
    _validate_payload(_TERMINAL_URI, doc, at, "terminal state")


def validate_request(doc, *, at: str = "$") -> None:
    """A runtime request (``paperclip.runtime_request.v1|v2``)."""
    _validate_payload(_REQUEST_URI, doc, at, "runtime request")


def validate_fixture(doc) -> None:
    """A replay fixture (``paperclip.prp.fixture.v1``).

    Its ``protocolVersion`` is the run's negotiated version: capabilities, commands and events are
    each checked by their own version (an event by its ``schemaVersion``) and refused when newer.
    All fail-closed checks of all parts run before any schema validation.
    """
    _object(doc, "$", "fixture")
    protocol_version = _required_version(doc, "protocolVersion", SUPPORTED_VERSIONS, "$", "Fixture")
    _required_version(doc, "fixtureVersion", FIXTURE_VERSIONS, "$", "Fixture")
    _discriminator(doc, {1: FIXTURE_SCHEMA}, None, "$", "Fixture")
    contract = _contract()
    parts = []  # (uri, document, path), validated once every precheck has passed
    capabilities = doc.get("capabilities")
    if isinstance(capabilities, dict):
        version = _precheck_versioned(capabilities, CAPABILITIES_SCHEMAS, protocol_version, "$.capabilities", "Capabilities")
        parts.append((_URIS["capabilities"][version], capabilities, "$.capabilities"))
    for i, item in enumerate(_items(doc, "commands")):
        at = f"$.commands[{i}]"
        version = _precheck_versioned(item, COMMAND_SCHEMAS, protocol_version, at, "Command")
        parts.append((_URIS["command"][version], item, at))
    for i, item in enumerate(_items(doc, "events")):
        at = f"$.events[{i}]"
        parts.append((contract.event_uri(_precheck_event(item, protocol_version, at), item), item, at))
    _scan({k: v for k, v in doc.items() if k not in ("capabilities", "commands", "events")}, "$")
    parts += [(_REQUEST_URI, request, f"$.requests[{i}]") for i, request in enumerate(_items(doc, "requests"))]
    for uri, part, at in parts:
        contract.check(uri, part, at)
    contract.check(_FIXTURE_URI, doc, "$")  # name, description, identity, result, and the rest


def _items(doc, key):
    value = doc.get(key)
    return value if isinstance(value, list) else ()


def validate_native_execution(doc) -> None:
    """A native-execution bundle (``paperclip-runner/native-execution/v1``; its events are PRP v1)."""
    _object(doc, "$", "native-execution bundle")
    _discriminator(doc, {1: NATIVE_EXECUTION_SCHEMA}, None, "$", "Native-execution bundle")
    events = _items(doc, "events")
    for i, event in enumerate(events):
        _precheck_event(event, 1, f"$.events[{i}]")
    _scan({k: v for k, v in doc.items() if k != "events"}, "$")
    contract = _contract()
    for i, event in enumerate(events):
        contract.check(contract.event_uri(1, event), event, f"$.events[{i}]")
    contract.check(_NATIVE_URI, doc, "$")
