"""Pure slot maths: schedules, zones and DST. No clock, no event loop, no I/O.

Modules here import only each other, ``cronlock._errors`` and ``cronlock._durations``.
This package re-exports nothing: import the module that defines a name.
"""
