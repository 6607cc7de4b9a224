"""Moved to :mod:`cronlock._locking.protocols` (kept while ``postgres/_locker/settings.py``
imports it)."""

from .protocols import RETENTION_MARGIN as RETENTION_MARGIN  # moved: _locking/protocols.py
