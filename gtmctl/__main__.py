"""``python -m gtmctl``: the ``gtm`` command, run by this interpreter (how ``gtm up
--processes``, the chaos runner and the tests start a child ``gtm`` without relying on
the console script being on ``PATH``)."""

from gtmctl.cli import main

main()
