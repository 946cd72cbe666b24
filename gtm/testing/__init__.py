"""Shipped test helpers: things our own tests use and that users can use to test against
gtm (an etcd process manager, fakes). Importing this package imports nothing heavy."""
