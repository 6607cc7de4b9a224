"""Where exclusion lives: the one place the coordination modes (session, lease) differ.

Re-exports nothing: import the module that defines a name.
"""
