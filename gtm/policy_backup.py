"""Saving policy generations to files: what makes ``gtm policy apply`` reversible.

The store keeps no history that outlives compaction, so before an apply writes, the
generation it replaces is saved whole, as one JSON file per document, in a directory of
its own (under ``--backup``, by default ``~/.local/state/gtm/policy-backups``). Applying
that directory with ``--prune`` makes it the policy again: it is the undo every apply
prints. ``gtm policy export`` writes the same layout for the generation in force, and
``gtm up`` saves a generation it replaces in its run directory.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from gtm.errors import GtmError
from gtm.policy_plan import ApplyPlan
from gtm.policy_store import (
    CommittedDocument,
    PolicyStoreError,
    StalePolicyRevision,
    committed_documents,
)
from gtm.state.store import StateStore
from policies.loader import builtin_jurisdictions_path, load_file
from policies.policyset import document_json


class BackupError(GtmError):
    """The policies could not be saved (an apply that needed the backup wrote nothing)."""


def backup_home(environ: Mapping[str, str] | None = None) -> Path:
    """Where backups go by default: ``$XDG_STATE_HOME/gtm/policy-backups``, else
    ``~/.local/state/gtm/policy-backups``."""
    env = os.environ if environ is None else environ
    base = Path(env["XDG_STATE_HOME"]) if env.get("XDG_STATE_HOME") else None
    return (base or Path.home() / ".local" / "state") / "gtm" / "policy-backups"


async def save_previous(store: StateStore, state: str, plan: ApplyPlan, root: Path) -> Path | None:
    """Save the committed generation the plan replaces (``None`` before generation 1),
    before anything is written: the backup holds it whole, so applying it with
    ``--prune`` is the undo."""
    try:
        generation, documents = await committed_documents(store)
    except PolicyStoreError:
        if not plan.prune:
            raise
        # A generation that cannot be read is replaced whole; save what is stored.
        generation = plan.base_generation
        documents = tuple(
            CommittedDocument(c.kind, c.name, c.before) for c in plan.changes if c.before
        )
    if generation != plan.base_generation:
        raise StalePolicyRevision(plan.base_generation, generation)
    if not documents:
        return None
    name = f"generation-{generation}-revision-{plan.base_revision}"
    directory = root / name
    for attempt in range(2, 100):
        if not directory.exists():
            break
        directory = root / f"{name}.{attempt}"
    write_documents(directory, documents, generation=generation, state=state)
    return directory


#: What a backup or export directory says about itself (the loader reads only .yaml,
#: .yml and .json files, so this one is not taken for a document).
_README = """\
Policy generation {generation} of {state}, saved {when} ({count} document(s)).
Make it the policy again (everything else is deleted):
  gtm policy apply --prune --state {state} {directory}
"""


def write_documents(
    directory: Path, documents: Sequence[CommittedDocument], *, generation: int, state: str
) -> int:
    """Write ``documents`` to a new (or empty) ``directory`` as ``KIND-NAME.json``;
    the shipped built-in jurisdictions are left out when unchanged (every apply adds
    them). Returns how many files were written."""
    builtin = {
        (d.kind.value, d.name): document_json(d.document)
        for d in load_file(builtin_jurisdictions_path())
    }
    kept = [d for d in documents if builtin.get((d.kind, d.name)) != d.value]
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if any(directory.iterdir()):
            raise BackupError(f"{directory} is not empty; name a new directory")
        for doc in kept:
            text = json.dumps(json.loads(doc.value), indent=2, ensure_ascii=False) + "\n"
            (directory / f"{doc.kind}-{doc.name}.json").write_text(text, "utf-8")
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        readme = _README.format(
            generation=generation,
            state=state,
            when=when,
            count=len(documents),
            directory=shlex.quote(str(directory)),
        )
        (directory / "README.txt").write_text(readme, "utf-8")
    except OSError as exc:
        raise BackupError(
            f"cannot save the policies to {directory}: {exc.strerror}; nothing was written "
            "(choose another place with --backup DIR)"
        ) from None
    return len(kept)
