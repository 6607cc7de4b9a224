"""The scheduler's settings, read from the Celery app's configuration (``cronlock_*``).

Only celery's configuration object is read here (as a mapping); celery itself is not
imported.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Literal

from .._dsn import DSN_ENV
from .._errors import ConfigError

__all__ = ("BeatSettings",)

Mode = Literal["session", "lease"]

_TABLE = "cronlock_runs"  # cronlock.postgres.DEFAULT_TABLE, without importing the backend

DEFAULT_LEASE = 5.0
"""Seconds of a lease (lease mode) unless ``cronlock_locker_options`` sets ``lease``."""


@dataclass(frozen=True, slots=True)
class BeatSettings:
    """How the beat replicas coordinate and send; each field is the app setting
    ``cronlock_<field>`` (:meth:`from_app`)."""

    dsn: str
    """The PostgreSQL DSN of the run ledger (``cronlock_dsn``, else ``$CRONLOCK_DSN``);
    required."""
    mode: Mode = "session"
    """Where exclusion lives: ``"session"`` (advisory locks on a direct connection) or
    ``"lease"`` (through a transaction-mode pooler): docs/guides/poolers.md."""
    ledger: str = _TABLE
    """The ledger's table (``PostgresLocker(table=)``)."""
    schema: str | None = None
    """The ledger's schema (``PostgresLocker(schema=)``; ``None``: the search path's)."""
    misfire_grace: float = 60.0
    """Seconds a slot may be late (an outage, a failover, a replica's restart) and still be
    sent, once; past it the slot is recorded as missed."""
    retries: int = 3
    """Further attempts at a slot whose send failed (the broker down): ``1 + retries`` in
    the fleet, never past the entry's next slot."""
    retry_delay: float = 1.0
    """Seconds before the first retry, doubled for each one after (jittered)."""
    timeout: float = 30.0
    """Seconds one send may take before it counts as failed (and is retried)."""
    recover: bool = True
    """Send a slot again, with the same task id, when the replica that claimed it died
    before recording the send (the send may or may not have reached the broker)."""
    metrics_port: int | None = None
    """Serve Prometheus metrics (:mod:`cronlock.prometheus`, the ``prometheus`` extra) of
    this replica's scheduler on ``http://0.0.0.0:<port>/metrics``; ``None``: no server."""
    locker_options: Mapping[str, Any] = field(default_factory=dict)
    """Further keyword arguments of :class:`cronlock.postgres.PostgresLocker`
    (``cronlock_locker_options``), e.g. ``{"statement_timeout": 5}``. ``lease`` is 5 s
    unless given here (the locker's own default is 20 s): in lease mode, a replica killed
    mid-send holds its entries for that long (docs/guides/celery-beat.md)."""

    @property
    def ledger_name(self) -> str:
        """``schema.table``, or the table alone without a schema: the name
        :func:`cronlock.celery.task_id` is given."""
        return f"{self.schema}.{self.ledger}" if self.schema else self.ledger

    @classmethod
    def from_app(cls, app: Any, **overrides: Any) -> BeatSettings:
        """The settings of Celery *app* (``app.conf.cronlock_*``), with *overrides* (a
        ``None`` override is ignored); a setting that is unknown or malformed raises
        :class:`cronlock.ConfigError` naming it."""
        conf: Mapping[str, Any] = app.conf
        known = set(cls.__dataclass_fields__)
        given: dict[str, Any] = {}
        for key in list(conf.keys()):
            if not isinstance(key, str) or not key.lower().startswith("cronlock_"):
                continue
            name = key[len("cronlock_") :].lower()
            if name not in known:
                raise ConfigError(
                    f"Celery setting {key!r} is not a cronlock setting "
                    f"(cronlock_{', cronlock_'.join(sorted(known))})"
                )
            given[name] = conf[key]
        given.update({k: v for k, v in overrides.items() if v is not None})
        if not given.get("dsn"):
            given["dsn"] = os.environ.get(DSN_ENV, "")
        if not given["dsn"]:
            raise ConfigError(
                f"no run ledger: set cronlock_dsn in the Celery app's configuration or "
                f"${DSN_ENV} to the PostgreSQL DSN"
            )
        return cls._checked(cls(**given))

    @classmethod
    def _checked(cls, settings: BeatSettings) -> BeatSettings:
        if not isinstance(settings.dsn, str):
            raise ConfigError(f"cronlock_dsn must be a string, got {settings.dsn!r}")
        from ..postgres._modes import checked_mode  # the mode seam: it alone knows the modes

        try:
            checked_mode(settings.mode, ledger=True, lease=DEFAULT_LEASE)
        except ConfigError as exc:
            raise ConfigError(f"cronlock_mode: {exc}") from None
        if not isinstance(settings.ledger, str) or not settings.ledger:
            raise ConfigError(f"cronlock_ledger must be a table name, got {settings.ledger!r}")
        if settings.schema is not None and (
            not isinstance(settings.schema, str) or not settings.schema
        ):
            raise ConfigError(f"cronlock_schema must be a schema name, got {settings.schema!r}")
        changes: dict[str, Any] = {}
        for name in ("misfire_grace", "retry_delay", "timeout"):
            value = getattr(settings, name)
            if isinstance(value, timedelta):
                value = value.total_seconds()
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
                or (name == "timeout" and value == 0)
            ):
                raise ConfigError(f"cronlock_{name} must be seconds >= 0, got {value!r}")
            changes[name] = float(value)
        retries = settings.retries
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigError(f"cronlock_retries must be a whole number >= 0, got {retries!r}")
        if not isinstance(settings.recover, bool):
            raise ConfigError(f"cronlock_recover must be True or False, got {settings.recover!r}")
        port = settings.metrics_port
        if port is not None and (
            isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536
        ):
            raise ConfigError(f"cronlock_metrics_port must be a TCP port, got {port!r}")
        if not isinstance(settings.locker_options, Mapping):
            raise ConfigError(
                f"cronlock_locker_options must be a mapping, got {settings.locker_options!r}"
            )
        return replace(settings, **changes)
