"""Moved to :mod:`cronlock._locking.protocols` (kept while ``postgres/_locker/locker.py``
imports it)."""

from .protocols import remember_claim as remember_claim  # moved: _locking/protocols.py
