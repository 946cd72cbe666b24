"""``python -m gtm``: the ``gtm`` command, exactly as the console script runs it.

The command lives in :mod:`gtmctl.cli` (the composition root, above every other layer);
this module only hands over to it, so ``python -m gtm`` and ``python -m gtmctl`` are the
same program as ``gtm``.
"""

from gtmctl.cli import main

main()
