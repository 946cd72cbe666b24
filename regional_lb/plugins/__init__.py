"""The regional tier's routing plugins (zone choice), one per module.

Registered by :func:`regional_lb.profiles.regional_registry` under the type names the
policy files use (``policies/examples/routing-profiles.yaml``).
"""
