"""Symphony ``WORKFLOW.md`` documents on the host (External Task Protocol §9.5).

- :mod:`.document`: the format (split, YAML without aliases, strict Liquid syntax check), the
  repository's committed ``WORKFLOW.md``;
- :mod:`.settings`: the known front matter keys, their types, what the host applies;
- :mod:`.cache`: the last good version of each document, an invalid one reported once;
- :mod:`.effective`: the document in force for an issue (project, repository, connector defaults).

Run knobs are resolved in :mod:`issues.services.run_policy`; the connectors render the task packet
from the same documents (``connectors.services.workflow_policy``).
"""
