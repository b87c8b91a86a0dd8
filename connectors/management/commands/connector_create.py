"""Create a connector instance for scripted set-up; prints its id and webhook URL."""
import json

from django.core.management.base import CommandError

from connectors.services.instances import instance_create, webhook_url

from ._base import ConnectorCommand


class Command(ConnectorCommand):
    help = "Create a connector instance (credentials and webhook secret as env:VAR references)."

    def add_arguments(self, parser):
        parser.add_argument("--company", required=True, help="Company issue prefix (e.g. ABC) or id.")
        parser.add_argument("--provider", required=True, help="Provider key, e.g. github_issues.")
        parser.add_argument("--name", required=True)
        parser.add_argument("--config", default="{}",
                            help="JSON object: containers, baseUrl, stateMapping, triageAgentId, projectId, …")
        parser.add_argument("--credentials", default="", help="env:VAR")
        parser.add_argument("--webhook-secret", default="", help="env:VAR")
        parser.add_argument("--user", help="Username recorded as the creator (default: system).")
        parser.add_argument("--json", action="store_true")

    KEYS = {"baseUrl": "base_url", "containers": "containers", "stateMapping": "state_mapping", "config": "config",
            "defaultSyncMode": "default_sync_mode", "defaultRunMode": "default_run_mode",
            "fieldPolicy": "field_policy", "writePolicy": "write_policy",
            "wakeOnExternalComment": "wake_on_external_comment", "autoImport": "auto_import",
            "commandPolicy": "command_policy", "routingAliases": "routing_aliases",
            "pollIntervalSeconds": "poll_interval_seconds", "reconcileIntervalSeconds": "reconcile_interval_seconds",
            "reconcileBatchSize": "reconcile_batch_size", "projectId": "project_id", "goalId": "goal_id",
            "triageAgentId": "triage_agent_id", "serviceAccountId": "service_account_id",
            "serviceAccountName": "service_account_name"}

    @staticmethod
    def _provider(key: str) -> str:
        """A provider key, or an unambiguous short form of one (``github`` -> ``github_issues``)."""
        from connectors.services.common import provider_known
        from connectors.providers.base import _REGISTRY, provider_keys

        try:
            keys = provider_keys()
        except ModuleNotFoundError:
            keys = sorted(_REGISTRY)
        if provider_known(key):
            return key
        matches = [k for k in keys if k.startswith(f"{key}_")]
        if len(matches) == 1:
            return matches[0]
        raise CommandError(f"Unknown provider '{key}' (known: {', '.join(keys) or 'none'}).")

    def handle(self, *args, **options):
        try:
            config = json.loads(options["config"])
        except json.JSONDecodeError as exc:
            raise CommandError(f"--config is not valid JSON: {exc}")
        if not isinstance(config, dict):
            raise CommandError("--config must be a JSON object.")
        rules = config.pop("routingRules", None)
        unknown = sorted(set(config) - set(self.KEYS))
        if unknown:
            raise CommandError(f"Unknown --config keys: {', '.join(unknown)} (use {', '.join(sorted(self.KEYS))}).")
        for flag in ("credentials", "webhook_secret"):
            value = options[flag]
            if value and not value.startswith("env:"):
                raise CommandError(f"--{flag.replace('_', '-')} must be env:VAR (secrets are never given inline).")
        company = self.company(options["company"])
        provider = self._provider(options["provider"])
        instance = self.call(
            instance_create, actor=self.actor(options), company=company, name=options["name"],
            provider_key=provider, credentials=options["credentials"],
            webhook_secret=options["webhook_secret"], routing_rules=rules,
            **{self.KEYS[k]: v for k, v in config.items()})
        result = {"id": str(instance.pk), "webhookUrl": webhook_url(instance), "name": instance.name,
                  "provider": instance.provider_key, "company": company.issue_prefix}
        self.emit(options, result, f"Created connector {instance.name} ({instance.pk})\nWebhook URL: "
                                   f"{result['webhookUrl']}")
