from django.conf import settings
from django.db import models
from django.db.models.functions import Lower

from issues.choices import CompanyStatus, MemberRole, WorkspaceStrategy

from .base import UUIDModel, choices_check


class Company(UUIDModel):
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    issue_prefix = models.CharField(max_length=10, unique=True, help_text="Identifier prefix, e.g. PAP for PAP-12.")
    issue_counter = models.PositiveIntegerField(default=0, help_text="Last issue number handed out.")
    status = models.CharField(max_length=16, choices=CompanyStatus.choices, default=CompanyStatus.ACTIVE)
    enable_cases = models.BooleanField(default=False, help_text="Feature flag: cases and workflow definitions.")
    budget_monthly_cents = models.PositiveBigIntegerField(default=0)
    spent_monthly_cents = models.PositiveBigIntegerField(default=0)
    spend_period = models.CharField(max_length=7, blank=True, help_text="The month (YYYY-MM) spend counts for.")
    require_board_approval_for_new_agents = models.BooleanField(
        default=False, help_text="A hire (POST /agent-hires) waits as pending_approval until a board user "
                                 "approves its hire_agent approval.")
    # Branding (upstream's brandColor and logoAssetId): "#rrggbb" or empty; the logo is one of its assets.
    brand_color = models.CharField(max_length=7, blank=True)
    logo_asset = models.ForeignKey("issues.Asset", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        verbose_name_plural = "companies"
        ordering = ["name"]
        constraints = [
            choices_check("status", CompanyStatus, "company_status_valid"),
            models.CheckConstraint(
                condition=models.Q(issue_prefix__regex=r"^[A-Z][A-Z0-9]{1,9}$"), name="company_prefix_format"
            ),
            models.CheckConstraint(condition=models.Q(brand_color="") | models.Q(brand_color__regex=r"^#[0-9a-f]{6}$"),
                                   name="company_brand_color_format"),
        ]

    def __str__(self):
        return f"{self.name} ({self.issue_prefix})"

    @property
    def logo_url(self) -> str | None:
        """Where the logo's bytes are read (the asset's content view), or None without a logo."""
        return f"/api/assets/{self.logo_asset_id}/content" if self.logo_asset_id else None


class Membership(models.Model):
    """A board user's role in one company."""

    company = models.ForeignKey(Company, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=MemberRole.choices, default=MemberRole.OPERATOR)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["company", "user"], name="membership_unique_user_company"),
            choices_check("role", MemberRole, "membership_role_valid"),
        ]

    def __str__(self):
        return f"{self.user} · {self.role} @ {self.company.issue_prefix}"


class Project(UUIDModel):
    company = models.ForeignKey(Company, on_delete=models.CASCADE, related_name="projects")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    status = models.CharField(max_length=32, default="active")
    # Upstream's planning fields (§5.5): the goals the project serves, its lead, target date and look.
    goals = models.ManyToManyField("issues.Goal", blank=True, related_name="projects")
    lead_agent = models.ForeignKey("issues.Agent", null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="led_projects")
    target_date = models.DateField(null=True, blank=True)
    color = models.CharField(max_length=40, blank=True)
    icon = models.CharField(max_length=200, blank=True)
    # Execution workspaces: how and from where runs of this project's issues get a folder.
    workspace_strategy = models.CharField(max_length=24, choices=WorkspaceStrategy.choices,
                                          default=WorkspaceStrategy.AGENT_DEFAULT)
    repository = models.CharField(max_length=1000, blank=True, help_text="Local path or URL of the git repository.")
    base_ref = models.CharField(max_length=200, blank=True, help_text="Branch or commit new worktrees start from.")
    branch_template = models.CharField(max_length=200, default="paperclip/{identifier}")
    workspace_hooks = models.JSONField(default=dict, blank=True,
                                       help_text="after_create, before_run, after_run, before_remove shell commands.")
    # Empty = not set here: the workflow document's hooks.timeout_ms, then the global default.
    hook_timeout_seconds = models.PositiveIntegerField(null=True, blank=True)
    # Run knobs set on the project (camelCase, see issues.workflow.settings); they beat the workflow
    # document's front matter, which beats the global defaults.
    run_settings = models.JSONField(default=dict, blank=True)
    # Workflow policy (External Task Protocol §9.5, layer 1): beats the repository's WORKFLOW.md.
    workflow_document = models.TextField(
        blank=True, help_text="WORKFLOW.md format: optional YAML front matter + Liquid body. Shapes the task packet "
                              "of tracker-driven work; an empty body falls back to the repository WORKFLOW.md or the "
                              "connector default.")

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(Lower("name"), "company", name="project_name_unique_per_company"),
            choices_check("workspace_strategy", WorkspaceStrategy, "project_workspace_strategy_valid"),
        ]

    def __str__(self):
        return self.name


class Goal(UUIDModel):
    company = models.ForeignKey(Company, on_delete=models.CASCADE, related_name="goals")
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    title = models.CharField(max_length=300)
    description = models.TextField(blank=True)
    level = models.CharField(max_length=16, default="company")
    status = models.CharField(max_length=32, default="active")
    owner_agent = models.ForeignKey("issues.Agent", null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="owned_goals")

    class Meta:
        ordering = ["title"]
        constraints = [
            models.CheckConstraint(condition=~models.Q(parent=models.F("id")), name="goal_not_own_parent"),
        ]

    def __str__(self):
        return self.title
