"""Shipped test helpers: things our own tests use and that users can use to test against
gtm (fakes such as an outage-switchable store, a ``gtm`` child process starter). Importing
this package imports nothing heavy.

Product code never imports it. The etcd launcher and the local certificate authority,
which ``gtm up`` runs, are product modules (:mod:`gtm.state.etcd_server`,
:mod:`gtm.state.etcd_cluster`, :mod:`gtm.pki`); ``gtm.testing.etcd``,
``gtm.testing.etcd_cluster`` and ``gtm.testing.pki`` remain as their old names."""
