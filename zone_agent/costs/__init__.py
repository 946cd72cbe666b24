"""The zone's decision formulas, one module per formula with every form of it.

Each module holds a formula's scalar reference, its numpy form and the binding of its
C kernel (the ``_*.c`` file beside it); the test beside it in
``tests/unit/zone_agent/costs/`` fails when two forms disagree. :mod:`.ttft` is the
predicted TTFT cost; :mod:`.blend` the default profile's scores and pick.
"""
