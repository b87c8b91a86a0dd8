from datetime import datetime, timezone as dt_timezone

from django.db import migrations, models
from django.db.models import Sum
from django.utils import timezone


def spend_counts_for_this_month(apps, schema_editor):
    """Until now a company's spend was never reset (only its agents' were): this month's spend is
    what the cost ledger holds for this month (the figure the dashboard already showed)."""
    Company, CostEvent = apps.get_model("issues", "Company"), apps.get_model("issues", "CostEvent")
    now = timezone.now().astimezone(dt_timezone.utc)
    start = datetime(now.year, now.month, 1, tzinfo=dt_timezone.utc)
    end = datetime(now.year + now.month // 12, now.month % 12 + 1, 1, tzinfo=dt_timezone.utc)
    spent = dict(CostEvent.objects.filter(occurred_at__gte=start, occurred_at__lt=end).values("company_id").order_by()
                 .annotate(total=Sum("cost_cents")).values_list("company_id", "total"))
    for company in Company.objects.only("pk"):
        Company.objects.filter(pk=company.pk).update(spend_period=now.strftime("%Y-%m"),
                                                     spent_monthly_cents=min(spent.get(company.pk) or 0, 2**63 - 1))


class Migration(migrations.Migration):

    dependencies = [
        ('issues', '0019_issue_billing_code'),
    ]

    operations = [
        migrations.AddField(
            model_name='company',
            name='spend_period',
            field=models.CharField(blank=True, help_text='The month (YYYY-MM) spend counts for.', max_length=7),
        ),
        migrations.RunPython(spend_counts_for_this_month, migrations.RunPython.noop),
    ]
