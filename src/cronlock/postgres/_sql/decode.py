"""Moved to :mod:`.runs`: kept only for modules being restructured now, which still import
these names from here (issue 34, step 4). Import from :mod:`.runs`."""

from __future__ import annotations

from .runs import R_RUN as R_RUN  # moved: postgres/_sql/runs.py
from .runs import decode_run as decode_run  # moved: postgres/_sql/runs.py
