"""Preflight checks: one module per group, a registry, a concurrent runner; checks never print."""
