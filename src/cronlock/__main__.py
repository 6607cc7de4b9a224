"""``python -m cronlock``: see :mod:`cronlock._cli`."""

from ._cli import main

raise SystemExit(main())
