"""Execution workspaces (seed 000 §9.4 and its subtask rule, seed 003 hooks, Symphony §9).

- :mod:`.keys` — ``workspace_key(identifier)``: sanitized folder names.
- :mod:`.paths` — ``safe_path(root, *parts)``: paths that never leave the root.
- :mod:`.service` — ``new_issue_workspace_fields``, ``workspace_admit``, ``workspace_after_run``,
  ``workspace_remove``, ``workspace_retention_sweep``, ``workspace_health``.
- :mod:`.errors` — ``WorkspaceBusy`` (409 ``workspace_busy``), ``HookFailed``, path/config/git errors.
"""
