"""Console routes of the issues app, added to the ``console`` namespace by ``issues/urls.py``."""
from django.urls import path

from . import agents, approvals, board_keys, dashboard, issues, runs

urlpatterns = [
    path("dashboard/", dashboard.dashboard, name="dashboard"),
    path("issues/board/", issues.issue_board, name="issue-board"),
    path("issues/<str:ref>/", issues.issue_detail, name="issue-detail"),
    path("issues/<str:ref>/change/", issues.issue_change, name="issue-change"),
    path("issues/<str:ref>/force-release/", issues.issue_force_release_view, name="issue-force-release"),
    path("issues/<str:ref>/comments/", issues.comment_add, name="issue-comment"),
    path("issues/<str:ref>/documents/<str:key>/", issues.document_detail, name="issue-document"),
    path("issues/<str:ref>/attachments/", issues.attachment_upload, name="issue-attachment-upload"),
    path("attachments/<uuid:attachment_id>/delete/", issues.attachment_remove, name="attachment-delete"),
    path("interactions/<uuid:interaction_id>/respond/", issues.interaction_answer, name="interaction-respond"),
    path("interactions/<uuid:interaction_id>/runtime-answer/", runs.runtime_request_answer,
         name="runtime-request-answer"),
    path("runs/", runs.run_list, name="run-list"),
    path("runs/<uuid:run_id>/", runs.run_detail, name="run-detail"),
    path("runs/<uuid:run_id>/log/", runs.run_log, name="run-log"),
    path("runs/<uuid:run_id>/runner/", runs.run_runner, name="run-runner"),
    path("runs/<uuid:run_id>/goal/", runs.run_goal, name="run-goal"),
    path("agents/", agents.agent_list, name="agent-list"),
    path("agents/new/", agents.agent_new, name="agent-create"),
    path("agents/<uuid:agent_id>/", agents.agent_detail, name="agent-detail"),
    path("agents/<uuid:agent_id>/pause/", agents.agent_pause_view, name="agent-pause"),
    path("agents/<uuid:agent_id>/resume/", agents.agent_resume_view, name="agent-resume"),
    path("agents/<uuid:agent_id>/permissions/", agents.agent_permissions_view, name="agent-permissions"),
    path("agents/<uuid:agent_id>/keys/", agents.agent_key_new, name="agent-key-create"),
    path("agents/<uuid:agent_id>/keys/<uuid:key_id>/revoke/", agents.agent_key_revoke, name="agent-key-revoke"),
    path("agents/<uuid:agent_id>/adapter/", agents.agent_adapter, name="agent-adapter"),
    path("approvals/", approvals.approval_list_page, name="approval-list"),
    path("approvals/<uuid:approval_id>/", approvals.approval_detail, name="approval-detail"),
    path("approvals/<uuid:approval_id>/decide/", approvals.approval_decide_view, name="approval-decide"),
    path("board-keys/", board_keys.board_key_list_page, name="board-key-list"),
    path("board-keys/new/", board_keys.board_key_new, name="board-key-create"),
    path("board-keys/<uuid:key_id>/revoke/", board_keys.board_key_revoke_view, name="board-key-revoke"),
]
