"""Moved to :mod:`cronlock._names` (kept while ``postgres/_locked_run.py`` imports it)."""

from ._names import check_job_name as check_job_name  # moved: _names.py
