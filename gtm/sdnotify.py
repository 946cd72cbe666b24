"""Readiness for a service manager: systemd's notify protocol, without libsystemd.

A unit of ``Type=notify`` starts its process with ``NOTIFY_SOCKET`` naming a unix
datagram socket, and holds the unit in "activating" (and its dependants waiting) until
the process sends ``READY=1`` there (sd_notify(3)). gtm's daemons send it once their
listeners are bound and they wait for a signal (:func:`gtm.serve.until_signalled`), and
``STOPPING=1`` when a signal starts their shutdown. Without ``NOTIFY_SOCKET`` (a shell,
``gtm up``'s children, a container) nothing is sent.

The message is one datagram of ``KEY=VALUE`` lines; the socket is a path, or an
abstract-namespace name written with a leading ``@``. The send never blocks (a full
queue drops the message with a warning): a service manager that stopped reading must
not stall the event loop.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)

#: The environment variable a service manager names its socket in.
NOTIFY_SOCKET = "NOTIFY_SOCKET"


def notify(state: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (``READY=1``, ``STOPPING=1``, ``STATUS=…``) to the service manager
    named by ``NOTIFY_SOCKET`` in ``environ`` (default: this process's environment).
    True when it was sent; False when there is no such socket or the send failed."""
    address = (os.environ if environ is None else environ).get(NOTIFY_SOCKET, "")
    if address.startswith("@"):
        address = "\0" + address[1:]
    elif not address.startswith("/"):
        return False  # unset, or a kind of socket (vsock) gtm's units do not use
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.setblocking(False)
        try:
            sock.sendto(state.encode("utf-8"), address)
        except OSError as exc:
            log.warning("notify %s: cannot send to %s: %s", state, address, exc)
            return False
    return True


__all__ = ["NOTIFY_SOCKET", "notify"]
