"""Maintenance scripts for the policies package data (run from the repository root)."""
