"""Jobs and the run engine: a job's options and run state, when runs happen, how one goes.

The only code that touches a job's run state, heap entries and wiring. Imported only by
``cronlock._scheduler``, ``cronlock._stored`` and the public face. Re-exports nothing.
"""
