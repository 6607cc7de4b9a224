"""The plug-in points (Locker, Hold, Elector and their capabilities) and the local lockers.

Re-exports nothing: import the module that defines a name.
"""
