"""Domain errors of execution workspaces (ApiError subclasses: they carry their HTTP status)."""
from issues.exceptions import ApiError, Conflict, Unprocessable


class WorkspaceBusy(Conflict):
    """Another live run is the writer of this workspace; the caller waits and retries."""

    code = "workspace_busy"
    message = "Another run is writing in this workspace."


class HookFailed(Unprocessable):
    """A fatal lifecycle hook (after_create, before_run) exited non-zero or timed out."""

    code = "hook_failed"
    message = "A workspace hook failed."


class WorkspacePathEscape(Unprocessable):
    code = "workspace_path_escape"
    message = "The workspace path leaves the workspace root."


class WorkspaceConfigError(Unprocessable):
    code = "workspace_config_invalid"
    message = "The project's workspace settings cannot be realized."


class WorkspaceGitFailed(ApiError):
    status_code = 502
    code = "workspace_git_failed"
    message = "A git command failed while preparing the workspace."


__all__ = ["HookFailed", "WorkspaceBusy", "WorkspaceConfigError", "WorkspaceGitFailed", "WorkspacePathEscape"]
