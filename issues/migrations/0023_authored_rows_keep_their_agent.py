"""Comments, attachments and document revisions keep the agent that wrote them (RESTRICT: purging
such an agent is refused; terminate it instead), and revisions get the author rules comments and
attachments have. Revisions written by an agent purged before this migration no longer name it:
they become the host's (``system``), the only author type that names nobody."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def unnamed_agent_revisions_to_system(apps, schema_editor):
    revisions = apps.get_model("issues", "DocumentRevision").objects
    revisions.filter(author_type="agent", author_agent__isnull=True).update(author_type="system")
    revisions.exclude(author_type__in=["user", "agent", "system", "external"]).update(author_type="system")


class Migration(migrations.Migration):

    dependencies = [
        ('issues', '0022_issue_attachments'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterField(
            model_name='attachment',
            name='author_agent',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.RESTRICT, related_name='+', to='issues.agent'),
        ),
        migrations.AlterField(
            model_name='comment',
            name='author_agent',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.RESTRICT, related_name='+', to='issues.agent'),
        ),
        migrations.AlterField(
            model_name='documentrevision',
            name='author_agent',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.RESTRICT, related_name='+', to='issues.agent'),
        ),
        migrations.RunPython(unnamed_agent_revisions_to_system, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name='documentrevision',
            constraint=models.CheckConstraint(condition=models.Q(('author_type__in', ['user', 'agent', 'system', 'external'])), name='document_revision_author_type_valid'),
        ),
        migrations.AddConstraint(
            model_name='documentrevision',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('author_type', 'agent'), _negated=True), ('author_agent__isnull', False), _connector='OR'), name='document_revision_agent_author_set'),
        ),
    ]
