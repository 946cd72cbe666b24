"""The regional tier's routing plugins (zone choice), one per module, over
:class:`regional_lb.view.ZoneBatch`.

Registered by :func:`regional_lb.profiles.regional_registry` under the type names of the
one vocabulary (``policies/examples/routing-profiles.yaml``).
"""
