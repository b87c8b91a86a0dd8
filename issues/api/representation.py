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

_local = threading.local()


def represent(serializer_class, instance) -> dict:
    """``serializer_class(instance).data`` for a context-free output serializer, without rebuilding
    its fields on every call."""
    return _per_thread("outputs", serializer_class).to_representation(instance)


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
