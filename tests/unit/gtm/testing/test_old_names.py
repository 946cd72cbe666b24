"""The etcd launcher and the local PKI moved out of ``gtm.testing`` into product modules;
their old module names still give the very same objects."""

from __future__ import annotations

import gtm.pki
import gtm.state.etcd_cluster
import gtm.state.etcd_server
import gtm.testing.etcd
import gtm.testing.etcd_cluster
import gtm.testing.pki


def test_old_names_are_the_new_objects() -> None:
    for old, new in (
        (gtm.testing.etcd, gtm.state.etcd_server),
        (gtm.testing.etcd_cluster, gtm.state.etcd_cluster),
        (gtm.testing.pki, gtm.pki),
    ):
        assert old.__all__, old.__name__
        for name in old.__all__:
            assert getattr(old, name) is getattr(new, name), (old.__name__, name)
