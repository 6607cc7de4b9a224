"""The operators' side: FleetControl, stored-schedule verbs, fleet views, the roster, the CLI.

Built on the replica side and the SQL home; the replica side never imports it.
Re-exports nothing: import the module that defines a name.
"""
