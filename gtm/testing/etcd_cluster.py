"""Old name of :mod:`gtm.state.etcd_cluster`, kept so code that imports it keeps working: the module
is product code now (``gtm up`` uses it), and lives in the core."""

from gtm.state.etcd_cluster import (
    LEADER_TIMEOUT_S,
    POLL_S,
    EtcdCluster,
    NoLeader,
    find_leader,
    member_names,
    member_status,
)

__all__ = [
    "LEADER_TIMEOUT_S",
    "POLL_S",
    "EtcdCluster",
    "NoLeader",
    "find_leader",
    "member_names",
    "member_status",
]
