"""``python -m cronlock``: the verbs, their arguments, the demo. Works without asyncpg.

Re-exports nothing: import the module that defines a name.
"""
