"""Hosts in network namespaces for the multi-host tests and benches (test support, not product code)."""
