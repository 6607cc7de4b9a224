"""A deterministic simulation of a cronlock fleet: several replicas running the real
scheduler and locker code on one virtual clock, a simulated PostgreSQL server behind the
connection layer, faults as data, and an oracle of the promise (DESIGN.md §3a, §6).

``python benchmarks/simulate.py`` runs it; docs/testing.md says how to replay and extend it.
Nothing here is imported by the library itself. Re-exports nothing: import the module that
defines a name.
"""
