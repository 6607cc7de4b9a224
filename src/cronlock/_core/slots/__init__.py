"""A slot's fate (DESIGN.md §3a): what became of each slot that did not simply run on time.

The fates, the rule that tells a late run from one on time, and :func:`account`, the one
call by which a decision is told: an event, the ledger's record (a locker that keeps one)
and, through the event, the metrics, all saying the same fate.
"""
