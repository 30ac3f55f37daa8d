"""The lock API: managers, leases, blocks, sets, kinds, transactions and the per-thread context."""
