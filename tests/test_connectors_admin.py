"""Django admin for the connectors app: every model registered and browsable; secrets never shown."""
import pytest
from django.apps import apps
from django.contrib.admin.sites import site
from django.urls import reverse

from connectors import secrets
from connectors.models import ConnectorInstance, ConnectorSecret
from tests.connector_factories import make_instance


def test_every_connectors_model_is_registered():
    assert set(apps.get_app_config("connectors").get_models()) <= set(site._registry)


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def test_changelists_and_change_pages_render(admin_client, company):
    instance, _ = make_instance(company)
    for model in apps.get_app_config("connectors").get_models():
        url = reverse(f"admin:connectors_{model._meta.model_name}_changelist")
        assert admin_client.get(url).status_code == 200, model
    page = admin_client.get(reverse("admin:connectors_connectorinstance_change", args=[instance.pk]))
    assert page.status_code == 200
    secret = ConnectorSecret.objects.first()
    detail = admin_client.get(reverse("admin:connectors_connectorsecret_change", args=[secret.pk]))
    assert detail.status_code == 200 and secret.ciphertext not in detail.content.decode()


def test_secret_references(company, monkeypatch, settings):
    ref = secrets.secret_store(company=company, name="t", value="s3cret")
    assert secrets.resolve(ref, company_id=company.pk) == "s3cret"
    assert "s3cret" not in ConnectorSecret.objects.get().ciphertext
    monkeypatch.setenv("PAPERCLIP_SECRET_SOME_TOKEN", "from-env")
    assert secrets.resolve("env:PAPERCLIP_SECRET_SOME_TOKEN", company_id=company.pk) == "from-env"
    with pytest.raises(secrets.SecretUnavailable):
        secrets.resolve("env:PAPERCLIP_SECRET_NOT_SET_ANYWHERE_123", company_id=company.pk)
    with pytest.raises(secrets.SecretUnavailable):
        secrets.resolve("plaintext", company_id=company.pk)
    from tests.factories import CompanyFactory

    with pytest.raises(secrets.SecretUnavailable):  # another company's stored secret is not usable
        secrets.resolve(ref, company_id=CompanyFactory().pk)
    from cryptography.fernet import Fernet

    settings.CONNECTORS = {**settings.CONNECTORS, "SECRETS_KEY": Fernet.generate_key().decode()}
    with pytest.raises(secrets.SecretUnavailable):  # a different key cannot read it
        secrets.resolve(ref, company_id=company.pk)
    assert ConnectorInstance.objects.count() == 0


@pytest.mark.parametrize("model_name,field,bad", [
    ("ConnectorInstance", "status", "exploded"), ("ConnectorInstance", "default_sync_mode", "sideways"),
    ("ConnectorInstance", "default_run_mode", "chaos"), ("ConnectorInstance", "command_policy", "anyone"),
    ("TaskLink", "status", "limbo"), ("TaskLink", "sync_mode", "x"), ("TaskLink", "run_mode", "x"),
    ("TaskLink", "origin_side", "x"), ("TaskLink", "external_state_category", "x"),
    ("InboundEvent", "status", "lost"), ("InboundEvent", "source", "x"), ("InboundEvent", "kind", "x"),
    ("InboundEvent", "error_category", "x"), ("Conflict", "kind", "x"), ("Conflict", "status", "x"),
    ("SyncError", "category", "x"), ("OutboundEffect", "kind", "x"), ("OutboundEffect", "status", "x"),
    ("RoutingRule", "kind", "x"), ("LinkTransition", "to_status", "x"),
])
def test_database_check_constraints_hold_every_enum(company, django_capture_on_commit_callbacks, model_name,
                                                    field, bad):
    """Each enum column is kept in its enum by the database itself (not only by Python)."""
    from django.db import IntegrityError, transaction
    from rest_framework.test import APIClient

    from connectors import models
    from connectors.services.links import conflict_open
    from connectors.services.outbound import effect_record
    from connectors.services.common import sync_error_record
    from tests.connector_helpers import post_webhook

    instance, store = make_instance(company, rules=[{"kind": "default_route"}])
    raw = store.add_task(1)
    body, _ = store.delivery("task", raw["id"])
    post_webhook(APIClient(), instance, body, capture=django_capture_on_commit_callbacks)
    link = models.TaskLink.objects.get()
    conflict_open(link=link, kind="deletion", detail="x")
    effect_record(link=link, kind="comment", source_id="s", payload={})
    sync_error_record(instance=instance, category="config", message="x")
    model = getattr(models, model_name)
    row = model.objects.order_by("pk").first()
    with pytest.raises(IntegrityError), transaction.atomic():
        model.objects.filter(pk=row.pk).update(**{field: bad})
