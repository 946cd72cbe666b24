"""Compliance policy files: schemas, loader, residency engine and audit trail.

This package is a leaf: it imports nothing else of gtm's, so compliance teams can
validate their files with it alone.
"""
