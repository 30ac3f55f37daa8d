"""The effect ledger: ``with lease.once(key) as effect:`` (docs/effects.md, "Effect ledger").

An effect (a charge, an e-mail, a report) is recorded in :class:`~.model.Effect`, one row per
key: *begun* before the block runs (committed at once, so a process killed inside the block
leaves it begun) and *done* when the block is left without an exception, in the caller's
transaction and fenced by the lease's token. The next holder reads what happened: never begun
or never finished (``pending``), begun by an earlier holder that did not finish
(``interrupted``), or done.
"""
