"""The last-good workflow document cache moved to the issues app (the host applies the documents'
front matter to runs, so it owns the cache; the connectors read it for the task packet)."""
from django.db import migrations


def copy_rows(apps, schema_editor):
    old = apps.get_model("connectors", "WorkflowPolicyCache")
    new = apps.get_model("issues", "WorkflowDocumentCache")
    new.objects.bulk_create([
        new(company_id=row.company_id, project_id=row.project_id, source=row.source, content_hash=row.content_hash,
            front_matter=row.front_matter, template=row.template, loaded_at=row.loaded_at, error_hash=row.error_hash,
            last_error=row.last_error)
        for row in old.objects.all()
    ])


class Migration(migrations.Migration):

    dependencies = [
        ("connectors", "0003_workflowpolicycache"),
        ("issues", "0008_autonomy_loop"),
    ]

    operations = [
        migrations.RunPython(copy_rows, migrations.RunPython.noop),
        migrations.DeleteModel(name="WorkflowPolicyCache"),
    ]
