"""The API's three URL includes are tried in order of traffic (paperclip/urls.py); that is safe only
while no path of one is also matched by another, which this checks for every route."""
import importlib
import re

from django.urls import Resolver404, URLResolver, get_resolver

API_URLCONFS = ("connectors.api.urls", "issues.api.urls", "cases.api.urls")
SAMPLE = {"uuid": "3f2b1c4e-0000-4000-8000-000000000001", "int": "1", "path": "x1/y1"}


def routes(urlconf: str):
    def walk(patterns, prefix=""):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, prefix + str(pattern.pattern))
            else:
                yield prefix + str(pattern.pattern)
    return list(walk(importlib.import_module(urlconf).urlpatterns))


def sample_path(route: str) -> str:
    """A path the route matches: each converter replaced by a value of its type."""
    return "/" + re.sub(r"<(?:(\w+):)?\w+>", lambda m: SAMPLE.get(m.group(1), "x1"), route)


def test_the_api_urlconfs_share_no_path():
    shared = []
    for owner in API_URLCONFS:
        for route in routes(owner):
            assert get_resolver(owner).resolve(sample_path(route)), route  # the sample is the route's
            for other in API_URLCONFS:
                if other == owner:
                    continue
                try:
                    match = get_resolver(other).resolve(sample_path(route))
                except Resolver404:
                    continue
                shared.append((owner, route, other, match.route))
    assert shared == []
