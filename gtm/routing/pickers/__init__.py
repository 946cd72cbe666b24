"""Built-in generic pickers, one per module (see gtm/routing/README.md)."""
