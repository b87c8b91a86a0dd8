"""Serializers built once per thread.

``SomeSerializer(obj).data`` deep-copies every declared field of the serializer (and of its nested
serializers) before it reads a single attribute: for the 35-field issue that is most of the time
a checkout spends serialising. An output serializer that reads no ``context`` keeps no per-call
state, so one instance per thread can represent any number of objects. The same holds for input:
validating a request body is ``run_validation`` on the bound fields, which keep nothing between
calls (the per-call ``initial_data`` is set for the call and removed after it).
"""
from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import datetime

from django.utils import timezone
from rest_framework import fields, serializers
from rest_framework.fields import SkipField
from rest_framework.relations import PKOnlyObject
from rest_framework.settings import api_settings

_local = threading.local()
_DATETIME = object()  # the plan's marker for an ISO 8601 DateTimeField
_MISSING = object()


def represent(serializer_class, instance) -> dict:
    """``serializer_class(instance).data`` for a context-free output serializer, without rebuilding
    its fields on every call. A field whose output is one attribute through a plain converter (an
    exact UUID, char, integer or ISO date-time field) is read directly; every other field, and any
    value the direct read cannot take as DRF would, goes through the DRF field as usual."""
    serializer = _per_thread("outputs", serializer_class)
    plan = _plan(serializer)
    if plan is None or isinstance(instance, Mapping):
        return serializer.to_representation(instance)
    out, zone = {}, None
    for name, attr, convert, field in plan:
        if convert is not None:
            value = getattr(instance, attr, _MISSING)  # missing: DRF decides (a default, a skip, its error)
            if value is None:
                out[name] = None
                continue
            if convert is _DATETIME:
                if isinstance(value, datetime) and timezone.is_aware(value):  # naive and text: DRF's rules
                    zone = zone or timezone.get_current_timezone()
                    text = value.astimezone(zone).isoformat()
                    out[name] = text[:-6] + "Z" if text.endswith("+00:00") else text
                    continue
            elif value is not _MISSING and not callable(value):
                out[name] = convert(value)
                continue
        try:  # as Serializer.to_representation does for one field
            attribute = field.get_attribute(instance)
        except SkipField:
            continue
        check_for_none = attribute.pk if isinstance(attribute, PKOnlyObject) else attribute
        out[name] = None if check_for_none is None else field.to_representation(attribute)
    return out


def _direct(field):
    """The converter DRF's ``to_representation`` amounts to for this field's non-null attribute, or
    None when the field must do it (a subclass may override it, so only the exact classes)."""
    kind = type(field)
    if len(field.source_attrs) != 1:
        return None
    if kind is fields.UUIDField and field.uuid_format == "hex_verbose":
        return str
    if kind is fields.CharField:
        return str
    if kind is fields.IntegerField:
        return int
    if (kind is fields.DateTimeField and not hasattr(field, "timezone")
            and str(getattr(field, "format", api_settings.DATETIME_FORMAT)).lower() == fields.ISO_8601):
        return _DATETIME
    return None


def _plan(serializer):
    """(name, attribute, converter or None, field) per readable field, built once per serializer
    instance; None when the serializer has its own ``to_representation``."""
    plan = serializer.__dict__.get("_representation_plan", False)
    if plan is False:
        if type(serializer).to_representation is not serializers.Serializer.to_representation:
            plan = None
        else:
            plan = [(f.field_name, f.source_attrs[0] if f.source_attrs else None, _direct(f), f)
                    for f in serializer._readable_fields]
        serializer.__dict__["_representation_plan"] = plan
    return plan


def _per_thread(role: str, serializer_class):
    """This thread's instance of ``serializer_class`` for ``role`` (fields bound once)."""
    cache = _local.__dict__.setdefault(role, {})
    serializer = cache.get(serializer_class)
    if serializer is None:
        serializer = cache[serializer_class] = serializer_class()
    return serializer


def validated(serializer_class, data):
    """What ``serializer_class(data=data)`` validates to, raising the ``ValidationError`` (same
    details) that ``is_valid(raise_exception=True)`` raises, without rebuilding its fields on every
    call. For serializers used without ``context`` (request bodies parsed by the views)."""
    serializer = _per_thread("inputs", serializer_class)
    serializer.initial_data = data  # validate() may ask what the body named
    try:
        return serializer.run_validation(data)
    finally:
        del serializer.initial_data
