"""Old name of :mod:`gtm.state.etcd_server`, kept so code that imports it keeps working: the module
is product code now (``gtm up`` uses it), and lives in the core."""

from gtm.state.etcd_server import (
    ELECTION_MS,
    ENV_BINARY,
    HEARTBEAT_MS,
    HOW_TO_GET_ETCD,
    STARTUP_TIMEOUT,
    EtcdNotFound,
    EtcdServer,
    EtcdServerTls,
    EtcdStartError,
    find_etcd_binary,
    free_ports,
)

__all__ = [
    "ELECTION_MS",
    "ENV_BINARY",
    "HEARTBEAT_MS",
    "HOW_TO_GET_ETCD",
    "STARTUP_TIMEOUT",
    "EtcdNotFound",
    "EtcdServer",
    "EtcdServerTls",
    "EtcdStartError",
    "find_etcd_binary",
    "free_ports",
]
