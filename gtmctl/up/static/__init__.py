"""Static assets of the status page (package data)."""
