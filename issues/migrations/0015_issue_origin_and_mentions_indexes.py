"""Indexes for finding an issue by what an import knows of it (§6.3): its origin, and (PostgreSQL
only) the addresses its description mentions (issues/mentioned_addresses.py says what a mention is)."""
from django.conf import settings
from django.db import migrations, models

from paperclip.core.postgres_sql import PostgresOnlySQL

# Every address an http(s) token of the text mentions: the text is split before each "http://" or
# "https://"; the token that starts a piece runs to whitespace; it is cut where the next character
# cannot continue an address (not [0-9A-Za-z_-]), and whole where it ends the piece only if whitespace
# or the end of the text follows (another "http" continues it). Kept as SQL so the index needs no
# extension; IMMUTABLE, as an index expression must be.
MENTIONED_ADDRESSES = r"""
CREATE OR REPLACE FUNCTION paperclip_mentioned_addresses(body text) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT AS $fn$
  SELECT coalesce(array_agg(DISTINCT left(t.token, c.len::int)), '{}')
  FROM (SELECT substring(p.piece FROM '^https?://\S+') AS token, length(p.piece) AS piece_length,
               p.ord = count(*) OVER () AS last
        FROM regexp_split_to_table(body, '(?=https?://)') WITH ORDINALITY AS p(piece, ord)) AS t,
       LATERAL (SELECT sum(length(s.part)) OVER (ORDER BY s.ord) AS len, s.ord, count(*) OVER () AS parts
                FROM regexp_split_to_table(t.token, '(?=[^0-9A-Za-z_-])') WITH ORDINALITY AS s(part, ord)) AS c
  WHERE t.token IS NOT NULL AND c.len >= 8
    AND (c.ord < c.parts OR length(t.token) < t.piece_length OR t.last)
$fn$;
CREATE INDEX issue_mentioned_addresses_idx ON issues_issue USING gin (paperclip_mentioned_addresses(description));
"""
DROP_MENTIONED_ADDRESSES = """
DROP INDEX IF EXISTS issue_mentioned_addresses_idx;
DROP FUNCTION IF EXISTS paperclip_mentioned_addresses(text);
"""


class Migration(migrations.Migration):

    dependencies = [
        ('issues', '0014_wake_folded_lean_indexes'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddIndex(
            model_name='issue',
            index=models.Index(fields=['company', 'origin_kind', 'origin_id'], name='issue_origin_idx'),
        ),
        PostgresOnlySQL(MENTIONED_ADDRESSES, DROP_MENTIONED_ADDRESSES),
    ]
