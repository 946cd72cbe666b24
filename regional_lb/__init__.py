"""Regional tier: tenant quotas, fair queueing, zone choice and spillover within residency."""
