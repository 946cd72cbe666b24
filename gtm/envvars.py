"""Every daemon flag from the environment: ``--foo-bar`` ↔ ``GTM_FOO_BAR``.

A daemon started by a service manager (a systemd unit's ``EnvironmentFile=``, a
Kubernetes ``env:``) is configured by environment variables as well as by flags. One
rule names them all, the rule the first ones followed (``GTM_STATE``, ``GTM_PEER_TOKEN``,
``GTM_TLS_CERT``): ``GTM_`` and the long flag's name in capitals, dashes as
underscores. The command's name is not part of it — each daemon runs with an
environment of its own, and one setting (the state store, the tiers' key, TLS files)
means the same to every tier. A flag on the command line wins over its variable; a
repeatable flag takes several values separated by spaces (paths: by ``:``); an on/off
flag takes ``1``/``0``, ``true``/``false``, ``yes``/``no``.

:func:`from_environment` applies the rule to a click command (a decorator above
``@click.command``): every option gets its variable, shown in ``--help``.
"""

from __future__ import annotations

from typing import TypeVar

import click

PREFIX = "GTM_"

#: The rule, as the daemons' ``--help`` states it.
RULE = (
    "Every option can also be set from the environment: --foo-bar as GTM_FOO_BAR "
    "(a flag on the command line wins)."
)

_C = TypeVar("_C", bound=click.Command)


def envvar_name(option: click.Option) -> str:
    """``GTM_FOO_BAR`` for ``--foo-bar`` (the option's first long name)."""
    long_names = [name for name in option.opts if name.startswith("--")]
    if not long_names:
        raise ValueError(f"option {option.name!r} has no long name to derive a variable from")
    return PREFIX + long_names[0][2:].replace("-", "_").upper()


def from_environment(command: _C) -> _C:
    """``command`` with an environment variable for each of its options (one it already
    names is kept), shown in its help, and :data:`RULE` in its epilog."""
    for param in command.params:
        if isinstance(param, click.Option):
            if not param.envvar:
                param.envvar = envvar_name(param)
            param.show_envvar = True
    command.epilog = f"{command.epilog}\n\n{RULE}" if command.epilog else RULE
    return command


__all__ = ["PREFIX", "RULE", "envvar_name", "from_environment"]
