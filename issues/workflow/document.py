"""Symphony's WORKFLOW.md format: optional YAML front matter between ``---`` lines (a mapping) and
a Liquid body, trimmed.

Parsing checks the YAML, that the front matter is a mapping, the known settings' types
(:mod:`issues.workflow.settings`) and the Liquid syntax; unknown variables and filters only fail at
render time (the one strict :data:`ENV`). Errors are :class:`PolicyInvalid` with Symphony's codes.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import yaml
from liquid import Environment, StrictUndefined
from liquid.exceptions import LiquidError

from .errors import PolicyInvalid
from .settings import validate_front_matter

log = logging.getLogger("paperclip.workflow")

# The one strict environment for every workflow template: unknown variables and filters raise.
ENV = Environment(undefined=StrictUndefined, strict_filters=True)

WORKFLOW_FILE = "WORKFLOW.md"
MAX_DOCUMENT_CHARS = 256 * 1024  # a prompt policy, not a data file
SOURCE_LABELS = {"project": "project workflow document", "repository": f"repository {WORKFLOW_FILE}",
                 "connector": "connector workflowDefaults"}


@dataclass(frozen=True)
class WorkflowDocument:
    """Parsed WORKFLOW.md: the front matter root map (kept whole) and the trimmed prompt body."""

    config: dict
    template: str


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class _NoAliasLoader(yaml.SafeLoader):
    """``yaml.safe_load`` without anchors/aliases: an alias bomb would otherwise expand without bound
    when the front matter is stored as JSON."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "YAML aliases are not allowed in front matter",
                                              event.start_mark)
        return super().compose_node(parent, index)


def split(text: str) -> tuple[list[str], list[str]]:
    """Symphony's split: a first line ``---`` opens the front matter, the next ``---`` closes it (no
    closing line: everything is front matter); without an opening line all of it is the body."""
    lines = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if not lines or lines[0].rstrip() != "---":
        return [], lines
    rest = lines[1:]
    for i, line in enumerate(rest):
        if line.rstrip() == "---":
            return rest[:i], rest[i + 1:]
    return rest, []


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return " ".join(text.split("\n")[:3])[:300] if text else type(exc).__name__


def parse_front_matter(yaml_text: str) -> dict:
    """The front matter as a JSON-compatible mapping (``{}`` when blank); raises :class:`PolicyInvalid`."""
    if not yaml_text.strip():
        return {}
    try:
        data = yaml.load(yaml_text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise PolicyInvalid("workflow_parse_error", f"invalid YAML front matter: {_first_line(exc)}") from exc
    if data is not None and not isinstance(data, dict):
        raise PolicyInvalid("workflow_front_matter_not_a_map",
                            f"the YAML front matter is a {type(data).__name__}, not a mapping")
    try:  # stored as JSON: dates become ISO strings, keys strings; NaN is refused (not JSON)
        return json.loads(json.dumps(data or {}, default=str, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise PolicyInvalid("workflow_parse_error", f"front matter is not JSON-compatible: {exc}") from exc


def parse_document(text: str) -> WorkflowDocument:
    """Parse a WORKFLOW.md document; raises :class:`PolicyInvalid` (a known setting of the wrong type
    included: that version is invalid as a whole)."""
    if len(text) > MAX_DOCUMENT_CHARS:
        raise PolicyInvalid("workflow_parse_error", f"the document is larger than {MAX_DOCUMENT_CHARS} characters")
    front, body = split(text)
    config = parse_front_matter("\n".join(front))
    validate_front_matter(config)
    template = "\n".join(body).strip()
    if template:
        try:
            ENV.parse(template)
        except LiquidError as exc:
            raise PolicyInvalid("template_parse_error", _first_line(exc)) from exc
    return WorkflowDocument(config=config, template=template)


def _local_repository(project) -> Path | None:
    from issues.workspaces import gitops

    repository = (project.repository or "").strip()
    if not repository or gitops.is_url(repository):
        return None
    path = Path(os.path.expanduser(repository))
    return path if path.is_absolute() and path.is_dir() else None


def repository_workflow(project) -> str | None:
    """``WORKFLOW.md`` committed at ``HEAD`` of the project's local repository (``None`` when there is
    no local git repository or no such file). Never touches the network: URLs are skipped."""
    from issues.workspaces import gitops
    from issues.workspaces.errors import WorkspaceGitFailed

    path = _local_repository(project)
    if path is None:
        return None
    try:
        proc = gitops.git("show", f"HEAD:{WORKFLOW_FILE}", cwd=path, check=False)
    except (WorkspaceGitFailed, ValueError) as exc:  # timeout / git missing / not UTF-8
        log.warning("project %s: %s unreadable: %s", project.pk, WORKFLOW_FILE, exc)
        return None
    return proc.stdout if proc.returncode == 0 else None


# --- a cheap re-read: git runs again only when HEAD moved ------------------------------------------

_MEMO: dict = {}  # (project id, repository) -> (HEAD signature, text)
_MEMO_LIMIT = 512


def _stat(path: Path):
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _git_dir(repo: Path) -> Path | None:
    dot_git = repo / ".git"
    if dot_git.is_dir():
        return dot_git
    if dot_git.is_file():  # a linked worktree or submodule: "gitdir: <path>"
        text = dot_git.read_text(errors="replace").strip()
        return (repo / text[7:].strip()).resolve() if text.startswith("gitdir:") else None
    return repo if (repo / "HEAD").is_file() and (repo / "objects").is_dir() else None  # bare


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def head_signature(repo: Path) -> tuple | None:
    """What identifies ``HEAD`` without running git: HEAD's content and the commit id in the loose
    ref it names (exact), else the packed-refs file's identity (git rewrites it whole). ``None`` when
    the layout is not recognised (then git runs)."""
    try:
        git_dir = _git_dir(repo)
    except OSError:
        return None
    content = _read(git_dir / "HEAD") if git_dir is not None else None
    if not content:
        return None
    if not content.startswith("ref:"):
        return (str(git_dir), content)  # detached: HEAD is the commit id
    common = git_dir
    commondir = _read(git_dir / "commondir")
    if commondir:
        common = (git_dir / commondir).resolve()
    ref = content[4:].strip()
    return (str(git_dir), content, _read(common / ref), _stat(common / "packed-refs"))


def repository_workflow_memo(project) -> str | None:
    """:func:`repository_workflow`, read again only when the repository's HEAD moved (run admission,
    hooks and the stall checks ask for the same document many times)."""
    path = _local_repository(project)
    if path is None:
        return None
    signature = head_signature(path)
    key = (str(project.pk), str(path))
    cached = _MEMO.get(key)
    if signature is not None and cached is not None and cached[0] == signature:
        return cached[1]
    text = repository_workflow(project)
    if signature is not None:
        if len(_MEMO) >= _MEMO_LIMIT:
            _MEMO.clear()
        _MEMO[key] = (signature, text)
    return text
