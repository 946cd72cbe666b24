"""State: the store protocol, its two implementations, the key schema and snapshots."""
