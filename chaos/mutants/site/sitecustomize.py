"""Applies the chaos mutant named in ``GTM_CHAOS_MUTANT`` at interpreter start-up.

``gtm chaos run --mutant`` puts this folder on the ``PYTHONPATH`` of the deployment it
launches, and only then (:mod:`chaos.mutants`); Python imports ``sitecustomize`` before
the process's own code, so a patched product function is in place before any module
binds it.
"""

import os

_NAME = os.environ.get("GTM_CHAOS_MUTANT")
if _NAME:
    from chaos.mutants import apply_in_process

    apply_in_process(_NAME)
