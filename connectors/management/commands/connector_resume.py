"""Resume a connector instance, or one link with --link."""
from connectors.services.interventions import instance_resume, link_resume

from ._base import InstanceOrLinkCommand


class Command(InstanceOrLinkCommand):
    help = "Resume a connector instance (INSTANCE) or a single link (--link LINK_ID)."
    verb = "resume"
    instance_action = staticmethod(instance_resume)
    link_action = staticmethod(link_resume)
