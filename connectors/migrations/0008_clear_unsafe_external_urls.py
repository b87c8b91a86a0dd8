"""Links stored before trackers' URLs were checked (paperclip.core.links) may hold a ``javascript:``
or ``data:`` URL that the API and exports still return. Clear every stored ``external_url`` that is
not an absolute http(s) URL with a host, as a sync would: the link's next sync writes the real one."""
from urllib.parse import urlsplit

from django.db import migrations

WEB_SCHEMES = ("http", "https")


def _web_url(value: str) -> bool:
    """The rule of paperclip.core.links.web_url as of this migration."""
    if value != value.strip():
        return False
    try:
        parts = urlsplit(value)
    except ValueError:
        return False
    return parts.scheme.lower() in WEB_SCHEMES and bool(parts.netloc)


def clear_unsafe_external_urls(apps, schema_editor):
    TaskLink = apps.get_model("connectors", "TaskLink")
    stored = TaskLink.objects.exclude(external_url="").values_list("pk", "external_url")
    unsafe = [pk for pk, url in stored.iterator(chunk_size=2000) if not _web_url(url)]
    for start in range(0, len(unsafe), 500):
        TaskLink.objects.filter(pk__in=unsafe[start:start + 500]).update(external_url="")


class Migration(migrations.Migration):

    dependencies = [
        ('connectors', '0007_link_task_pairings_index'),
    ]

    operations = [
        migrations.RunPython(clear_unsafe_external_urls, migrations.RunPython.noop, elidable=True),
    ]
