"""Chaos tooling: a Toxiproxy-compatible fault proxy, process/etcd faults, game-day runner."""
