"""Moved to :mod:`.claims`: kept only for modules being restructured now, which still import
these names from here (issue 34, step 4). Import from :mod:`.claims`."""

from __future__ import annotations

from .claims import TRY_LOCK_ON_SQL as TRY_LOCK_ON_SQL  # moved: postgres/_sql/claims.py
from .claims import TRY_LOCK_SQL as TRY_LOCK_SQL  # moved: postgres/_sql/claims.py
from .claims import UNLOCK_SQL as UNLOCK_SQL  # moved: postgres/_sql/claims.py
