"""The mentions index (0015) answers every import's §6.3 lookup, so searches must stay cheap between
vacuums (PostgreSQL only):

* ``fastupdate = off``: with it on, new entries wait in the GIN pending list, which every search reads
  whole until a vacuum merges it; a burst of imports grows it by one entry per issue written, and
  the planner, seeing it, falls back to calling the function on every row. Descriptions mention few
  addresses, so writing them straight into the index costs an insert little.
* ``COST 1000``: a call splits the text with regular expressions (measured here about 70 µs, some
  thousand times a built-in operator), so the planner prefers the index to calling it per row."""
from django.db import migrations

from paperclip.core.postgres_sql import PostgresOnlySQL

FORWARD = """
ALTER INDEX issue_mentioned_addresses_idx SET (fastupdate = off);
SELECT gin_clean_pending_list('issue_mentioned_addresses_idx'::regclass);
ALTER FUNCTION paperclip_mentioned_addresses(text) COST 1000;
"""
BACKWARD = """
ALTER FUNCTION paperclip_mentioned_addresses(text) COST 100;
ALTER INDEX issue_mentioned_addresses_idx RESET (fastupdate);
"""


class Migration(migrations.Migration):

    dependencies = [
        ('issues', '0015_issue_origin_and_mentions_indexes'),
    ]

    operations = [
        PostgresOnlySQL(FORWARD, BACKWARD),
    ]
