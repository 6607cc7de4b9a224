"""How statements reach the server: connection sources, dedicated and borrowed
connections, reconnecting with backoff, and the one translation of backend errors.

Re-exports nothing: import the module that defines a name.
"""
