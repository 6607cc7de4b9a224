"""What each named statement of ``cronlock.postgres._sql`` does, in the simulated server.

A statement is recognised by its text, built by the same function of ``_sql`` that the
library calls (so no SQL is written here, and a statement changed in ``_sql`` is a
statement this model no longer knows: it fails loudly, :class:`NotModelled`, until a
handler is given for it). Each handler takes the execution context (:class:`..server.Exec`)
and the statement's arguments, and returns its rows (a list of :class:`..rows.Row`) or, for
``execute``, a status text. The modules of this folder hold the handlers by the ``_sql``
module they answer for; :mod:`.all` gathers them; :mod:`.registry` matches a text to its handler.
"""
