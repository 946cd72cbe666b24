"""Built-in generic filters, one per module (see gtm/routing/README.md).

Tier-specific filters (residency, health, model availability) live with their tiers'
candidate types; these are the ones that work on any candidate.
"""
