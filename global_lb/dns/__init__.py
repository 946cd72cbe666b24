"""The global tier's authoritative GeoDNS server (ARCHITECTURE §9).

* :mod:`~global_lb.dns.wire` — query parsing and response assembly (sans-io);
* :mod:`~global_lb.dns.zone` — the zone's names, SOA/NS and configuration;
* :mod:`~global_lb.dns.rrl` — response rate limiting per client prefix, with slip;
* :mod:`~global_lb.dns.responder` — answers: residency, region choice, ECS scopes, the
  precomputed wire-format answers;
* :mod:`~global_lb.dns.server` — asyncio UDP and TCP listeners around the responder.
"""
