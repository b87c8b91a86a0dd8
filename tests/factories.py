from functools import cache

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import get_hasher, make_password

from issues.choices import AgentRole, MemberRole
from issues.models import Agent, Company, Goal, HeartbeatRun, Issue, Membership, Project


class CompanyFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Company

    name = factory.Sequence(lambda n: f"Company {n}")
    issue_prefix = factory.Sequence(lambda n: f"C{n:03d}")


TEST_PASSWORD = "pw-for-tests-only"


def _test_password_hash() -> str:
    """The test password hashed with the configured (production) hasher, once per process and
    hasher: hashing it per user cost about half a second each on a 2-core machine, minutes of every
    suite run. Logging in still checks this real hash. Keyed by the preferred hasher because a test
    may configure another (a hash made by a hasher no longer configured never verifies)."""
    return _hash_with(get_hasher().algorithm)


@cache
def _hash_with(algorithm: str) -> str:
    return make_password(TEST_PASSWORD, hasher=algorithm)


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.LazyFunction(_test_password_hash)


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    company = factory.SubFactory(CompanyFactory)
    user = factory.SubFactory(UserFactory)
    role = MemberRole.OWNER


class AgentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Agent

    company = factory.SubFactory(CompanyFactory)
    name = factory.Sequence(lambda n: f"agent-{n}")
    role = AgentRole.ENGINEER


class ProjectFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Project

    company = factory.SubFactory(CompanyFactory)
    name = factory.Sequence(lambda n: f"Project {n}")


class GoalFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Goal

    company = factory.SubFactory(CompanyFactory)
    title = factory.Sequence(lambda n: f"Goal {n}")


class RunFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = HeartbeatRun

    agent = factory.SubFactory(AgentFactory)
    company = factory.LazyAttribute(lambda o: o.agent.company)
    status = "running"


class IssueFactory(factory.django.DjangoModelFactory):
    """Numbers come from the company counter, as the service hands them out."""

    class Meta:
        model = Issue

    company = factory.SubFactory(CompanyFactory)
    title = factory.Sequence(lambda n: f"Issue {n}")
    status = "todo"

    @classmethod
    def _create(cls, model_class, *args, **kwargs):
        from django.db.models import F

        company = kwargs["company"]
        Company.objects.filter(pk=company.pk).update(issue_counter=F("issue_counter") + 1)
        company.refresh_from_db(fields=["issue_counter"])
        kwargs.setdefault("number", company.issue_counter)
        kwargs.setdefault("identifier", f"{company.issue_prefix}-{kwargs['number']}")
        return super()._create(model_class, *args, **kwargs)
