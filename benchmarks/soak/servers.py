"""The soak's servers: a primary, a streaming standby of it, and one address that moves.

The replicas reach PostgreSQL through one endpoint, as they would through a DNS name, a
virtual IP or HAProxy in front of a highly available pair. In session mode that endpoint is
the per-replica proxies (faultproxy.py), which connect to the primary; in lease mode it is
PgBouncer, whose ``[databases]`` entry names the primary (the proxies connect to
PgBouncer). :class:`Servers` owns the pair and moves the endpoint:

- :meth:`Servers.fail_over` with ``planned=False`` (the ``failover`` fault): the primary
  crashes (``pg_ctl stop -m immediate``); :data:`CRASH_NOTICED` seconds later (the time an
  HA manager takes to give up on it) the standby is promoted (``pg_ctl promote``) and the
  endpoint moves to it. With ``planned=True`` (``switchover``): the primary stops cleanly
  (``-m fast``: its sessions are terminated, and it sends the standby all its WAL before it
  exits), then the same promotion and move.
- Moving the endpoint: in session mode each proxy sends new connections to the new primary
  and aborts its open ones. In lease mode PgBouncer's config names the new primary and it
  reloads (SIGHUP, as ``RELOAD``): new server connections go there, those to the old server
  are closed as they are released, and its clients' connections stay open.
- Then a new standby of the new primary is made in the background (``pg_basebackup``), so
  that any number of failovers can follow; until it streams, :attr:`Servers.ready` is
  False and the nemesis chooses another fault. Old primaries stay, stopped, until the soak
  ends (their logs are kept with the evidence).

Replication is asynchronous (``pg_basebackup -R``'s default): a crash can lose the last
commits the standby had not yet received (docs/ledger.md, "What a crash or a failover can
lose"); a switchover loses none.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "postgres"))
from cluster import Cluster
from faultproxy import FaultProxy
from pgbouncer import PgBouncer

CRASH_NOTICED = 3.0
"""Seconds from the primary's crash to the standby's promotion."""
STANDBY_ATTEMPTS = 3
"""A new standby is tried this many times (a fault may cut its ``pg_basebackup``)."""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Pooler(PgBouncer):
    """The tests' PgBouncer, which the soak can point at another server while it runs."""

    def retarget(self, port: int) -> None:
        """Point the pooled database at *port* (same host) and reload; return once
        PgBouncer's ``SHOW DATABASES`` names the new port."""
        pid = self.pid
        assert pid is not None, "PgBouncer is not running"
        self.target_port = port
        self._write_config()  # the same listen port: only the [databases] entry changed
        os.kill(pid, signal.SIGHUP)  # PgBouncer's RELOAD
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = self.show("DATABASES")
            if any(r["name"] == self.dbname and r["port"] == str(port) for r in rows):
                return
            time.sleep(0.05)
        raise RuntimeError(f"PgBouncer did not take the new server (port {port}) within 30 s")


class Servers:
    """The soak's primary and standby, and the endpoint the replicas reach them through:
    *proxies* (session mode) or *bouncer* (lease mode), both pointed at *primary* already."""

    def __init__(self, primary: Cluster, proxies: list[FaultProxy], bouncer: Pooler | None) -> None:
        self.primary = primary
        self.standby: Cluster | None = None
        self.proxies, self.bouncer = proxies, bouncer
        self.clusters = [primary]
        """Every cluster of the soak, the stopped old primaries too (the first one's
        ``destroy()`` removes them all: each is a standby of the one before)."""
        self.failovers = 0
        self._making: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        """Whether a standby streams from the primary (a failover can be injected)."""
        return self.standby is not None

    async def start(self) -> None:
        """Make the first standby, before the replicas start."""
        await self._make_standby()
        if self.standby is None:
            raise RuntimeError("no standby could be made of the soak's primary")

    async def wait_ready(self, timeout: float) -> bool:
        """Wait up to *timeout* s for a standby; whether there is one."""
        if self._making is not None and not self._making.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._making), timeout)
        return self.ready

    async def restart(self) -> None:
        """Crash-restart the primary (``pg_ctl restart -m immediate``); its standby stays."""
        await asyncio.to_thread(self.primary.restart, "immediate")

    async def fail_over(self, *, planned: bool) -> str:
        """Stop the primary (crash it, or stop it cleanly if *planned*), promote the standby,
        move the endpoint to it, and start making a new standby; what happened, for the log."""
        old, new = self.primary, self.standby
        assert new is not None, "no standby to fail over to"
        self.standby = None
        if planned:
            await asyncio.to_thread(old.stop, "fast")
        else:
            await asyncio.to_thread(old.crash)
            await asyncio.sleep(CRASH_NOTICED)
        stopped = time.time()
        await asyncio.to_thread(new.promote)
        promoted = time.time()
        self.primary = new
        self.failovers += 1
        if self.bouncer is not None:
            await asyncio.to_thread(self.bouncer.retarget, new.port)
        else:
            for proxy in self.proxies:
                proxy.retarget(new.port)
        self._making = asyncio.create_task(self._make_standby(), name="soak-standby")
        how = "stopped (fast)" if planned else f"crashed, {CRASH_NOTICED:.0f} s waited"
        return (
            f"of the primary (port {old.port}, {how}) to its standby (port {new.port}, "
            f"promoted in {promoted - stopped:.1f} s)"
        )

    async def close(self) -> None:
        """Wait for a standby still being made (its cluster is removed with the others)."""
        if self._making is not None:
            await asyncio.gather(self._making, return_exceptions=True)

    def keep_logs(self, evidence: Path) -> None:
        """Copy each cluster's server log into *evidence* (``server-<port>.log``)."""
        for cluster in self.clusters:
            if cluster.root is not None:
                with contextlib.suppress(OSError):
                    shutil.copy(Path(cluster.root) / "log", evidence / f"server-{cluster.port}.log")

    async def _make_standby(self) -> None:
        primary = self.primary
        for attempt in range(1, STANDBY_ATTEMPTS + 1):
            try:
                standby = await asyncio.to_thread(primary.standby)
            except Exception as exc:  # a restart fault cut its pg_basebackup, say
                log(f"standby of port {primary.port}, attempt {attempt}, failed: {exc!r}")
                await asyncio.sleep(1.0)
                continue
            self.clusters.append(standby)
            if not await self._streaming(primary):
                log(f"standby on port {standby.port} not streaming after 60 s")
                continue
            if self.primary is primary:  # no failover meanwhile (none is made without one)
                self.standby = standby
                log(f"standby of port {primary.port} streams, on port {standby.port}")
            return
        log(f"no standby of port {primary.port}: no more failovers in this soak")

    @staticmethod
    async def _streaming(primary: Cluster) -> bool:
        """Whether *primary* streams WAL to a standby within 60 s (a restart fault may
        delay it)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, asyncpg.PostgresError):
                conn = await asyncpg.connect(primary.dsn, timeout=5)
                try:
                    streaming = await conn.fetchval(
                        "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
                    )
                finally:
                    await conn.close()
                if streaming:
                    return True
            await asyncio.sleep(0.2)
        return False
