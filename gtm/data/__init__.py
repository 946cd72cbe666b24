"""Package data: the example topology of ``gtm up`` and the client cities of ``gtm load``."""
