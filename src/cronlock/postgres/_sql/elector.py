"""The elector's statements: the leaders table, its ballots and the fencing checks.

Empty for now: those statements still live in ``postgres/_modes/ballots.py`` and
``postgres/_modes/fencing.py``, which are being restructured (issue 34); they move here
once that is done, and the allow-list in tests/test_architecture.py loses their entries.
"""
