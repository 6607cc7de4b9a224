"""Every SQL statement the backend sends, built from one definition of the ledger's tables.

No SQL text lives anywhere else in the package (tests/test_architecture.py checks it).
Re-exports nothing: import the module that defines a name.
"""
