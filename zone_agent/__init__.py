"""Zone agent: assigns each request to one GPU by expected compute cost and proxies it."""
