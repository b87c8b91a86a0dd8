"""Pause a connector instance, or one link with --link."""
from connectors.services.interventions import instance_pause, link_pause

from ._base import InstanceOrLinkCommand


class Command(InstanceOrLinkCommand):
    help = "Pause a connector instance (INSTANCE) or a single link (--link LINK_ID)."
    verb = "pause"
    instance_action = staticmethod(instance_pause)
    link_action = staticmethod(link_pause)
