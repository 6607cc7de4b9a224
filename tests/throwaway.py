"""The names of the suite's throwaway schemas and databases on a server it is given, and
which of them a run that died (killed, say) left behind."""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Iterable

__all__ = ("left_by_dead_runs", "prefix")


def prefix() -> str:
    """``cronlock_test_<host>_``: this host's throwaway names (the pid of their run follows)."""
    host = hashlib.blake2b(socket.gethostname().encode(), digest_size=4).hexdigest()
    return f"cronlock_test_{host}_"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def left_by_dead_runs(names: Iterable[str]) -> list[str]:
    """Those of *names* made on this host by a run whose process is gone."""
    mine = prefix()
    return [
        name
        for name in names
        if name.startswith(mine)
        and (pid := name[len(mine) :].partition("_")[0]).isdigit()
        and not _alive(int(pid))
    ]
