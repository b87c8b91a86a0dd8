"""A migration operation for SQL only PostgreSQL has (functions, expression and GIN indexes): run there,
a no-op on SQLite, which answers the same questions another way."""
from django.db import migrations


class PostgresOnlySQL(migrations.RunSQL):
    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)
