"""gtm's version, and the name it is distributed under.

The distribution (what ``pip install`` names, what :mod:`importlib.metadata` finds) is
``gtm-traffic-manager``: ``gtm`` on PyPI is an unrelated project. The command is ``gtm``
and the import packages keep their names; nothing imports gtm by its distribution name
except the code that asks about the install itself (:mod:`gtm.native`, :mod:`gtm.extras`).
"""

__version__ = "0.1.0.dev0"

#: The distribution name (pyproject.toml ``[project] name``).
DISTRIBUTION = "gtm-traffic-manager"
