"""``python -m cronlock``: see :mod:`cronlock._cli.main`."""

from ._cli.main import main

raise SystemExit(main())
