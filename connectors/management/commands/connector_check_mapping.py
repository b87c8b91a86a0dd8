"""Check a connector's state mapping against the provider's live workflow (§7.2 setup validation)."""
from django.core.management.base import CommandError

from connectors.services.mapping_check import INVALID, state_mapping_check

from ._base import ConnectorCommand


class Command(ConnectorCommand):
    help = ("Check a connector instance's state mapping (named and per-container overrides, outboundStates) "
            "against each container's live workflow; exits non-zero when the mapping is invalid.")

    def add_arguments(self, parser):
        parser.add_argument("instance")
        parser.add_argument("--user", help="Username recorded as the acting operator (default: system).")
        parser.add_argument("--json", action="store_true", help="Print the result as JSON.")

    def handle(self, *args, **options):
        instance = self.instance(options["instance"])
        report = self.call(state_mapping_check, actor=self.actor(options), instance=instance)
        self.emit(options, report, self.text(instance, report))
        if report["status"] == INVALID:  # scripts can gate on it; the report is printed already
            raise CommandError(f"The state mapping of {instance.name} is invalid ({len(report['errors'])} error(s)).")

    @staticmethod
    def text(instance, report) -> str:
        lines = [f"{instance.name} ({report['providerKey']}): {report['status']} — {report['message']}"]
        for row in report["containers"]:
            states = ", ".join(f"{s['name']}={s['category']}{'' if s['mapped'] else ' (unmapped)'}"
                               for s in row["states"])
            lines.append(f"  {row['container']}: {states if row['checked'] else 'not read'}")
        lines += [f"  ERROR {i['field']}: {i['reason']}" for i in report["errors"]]
        lines += [f"  WARNING {i['field']}: {i['reason']}" for i in report["warnings"]]
        lines += [f"  PROVIDER {e['container'] or '-'}: {e['category']}: {e['message']}"
                  for e in report["providerErrors"]]
        return "\n".join(lines)
