"""Upstream's ``changeSummary`` on a document revision (the writer's note; empty when none given)."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('issues', '0016_mentions_index_without_pending_list'),
    ]

    operations = [
        migrations.AddField(
            model_name='documentrevision',
            name='change_summary',
            field=models.CharField(blank=True, max_length=500),
        ),
    ]
