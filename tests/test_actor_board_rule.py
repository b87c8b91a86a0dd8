"""The one board-only rule (``Actor.ensure_board``, upstream's ``assertBoard``) every board-only
service and view calls: agents get the 403 ``board_only``; board users and the host pass."""
import pytest

from issues.actors import SYSTEM, Actor
from issues.exceptions import Forbidden
from tests.factories import AgentFactory, MembershipFactory


def test_agents_and_nobody_are_refused_with_the_given_words(company):
    for actor in (Actor(agent=AgentFactory(company=company)), Actor()):
        with pytest.raises(Forbidden) as refused:
            actor.ensure_board("Only board users answer interactions.")
        assert (refused.value.code, refused.value.message) == ("board_only", "Only board users answer interactions.")


def test_board_users_and_the_host_pass(company):
    Actor(user=MembershipFactory(company=company, role="viewer").user).ensure_board()  # the role is checked apart
    SYSTEM.ensure_board()
