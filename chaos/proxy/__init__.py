"""A Toxiproxy-compatible fault proxy: the Toxiproxy 2.x HTTP API and its toxics.

Run it with ``gtm chaos proxy``; drive it with any Toxiproxy client, or with
:class:`chaos.proxy.client.ToxiproxyClient`. Embedding it in a process::

    service = FaultProxyService(registry=new_registry())
    server = FaultProxyServer(service, registry)
    host, port = await server.start("127.0.0.1", 0)
    ...
    await server.close()
"""

from chaos.proxy.models import Direction, ProxyView, ToxicView
from chaos.proxy.server import FaultProxyServer
from chaos.proxy.service import TOXIPROXY_VERSION, FaultProxyService

__all__ = [
    "TOXIPROXY_VERSION",
    "Direction",
    "FaultProxyServer",
    "FaultProxyService",
    "ProxyView",
    "ToxicView",
]
