"""The addresses an issue's description mentions (§6.3: an import links the issue "whose description
references the task" rather than create another).

An address is mentioned where it appears whole: not followed by a character that would continue it
(``…/issues/1`` is not mentioned by ``…/issues/12``, nor ``ENG-1`` by ``ENG-12``; a fragment, a
slash or punctuation may follow). On PostgreSQL the http(s) addresses every description mentions are
indexed (migration 0015's ``paperclip_mentioned_addresses``, the same rule in SQL), so finding the
issues that mention one is an index probe, not a scan of the company's descriptions. On SQLite, and
for an address that index cannot hold, the descriptions are searched with :func:`mention_pattern`."""
import re

CONTINUES = "0-9A-Za-z_-"  # characters that would make a longer address
_INDEXABLE = re.compile(r"https?://[!-~]+")  # printable ASCII, no spaces
_SCHEME = re.compile(r"https?://")


def mention_pattern(address: str) -> str:
    """A regular expression for a whole mention of ``address``, read alike by PostgreSQL and by
    Python (SQLite)."""
    return re.escape(address) + rf"(?![{CONTINUES}])"


def indexed(address: str, vendor: str) -> bool:
    """Whether the mentions index can answer for ``address``: PostgreSQL, an http(s) address of
    printable ASCII with no other scheme inside (the function splits the text before each one)."""
    return (vendor == "postgresql" and _INDEXABLE.fullmatch(address or "") is not None
            and _SCHEME.search(address, 1) is None)


def indexed_condition(column: str) -> str:
    """SQL: ``column`` (a description) mentions the address given as the one parameter (the form
    the expression index answers)."""
    return f"paperclip_mentioned_addresses({column}) @> ARRAY[%s]::text[]"
