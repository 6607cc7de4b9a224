"""The privileges each part of a fleet needs on the ledger, as ``GRANT`` statements, and the
catalog read that tells which of them a role lacks.

Three roles, each given only what the statements of its entry points need (read from the
other modules of this folder):

- **replica**: a :class:`~cronlock.postgres.PostgresLocker` and its scheduler. It claims,
  records and prunes runs, notes its jobs, keeps its members and definitions rows, reads
  pauses and triggers, notes its problems with stored schedules (a column grant), and in
  lease mode writes leases. It cannot pause, trigger or retire a job, nor write a stored
  schedule: a compromised replica cannot steer the fleet.
- **operator**: the reader's reads, and ``pause``, ``resume``, ``trigger``, ``retire``, the
  ``schedules`` edits (FleetControl's verbs) and the dashboard's actions. Its dashboard makes
  and reads the CSRF key in ``<table>_secrets``.
- **reader**: ``status``, ``history``, ``schedules list`` and the read-only dashboard. No
  right on ``<table>_secrets``: it holds the dashboard's CSRF key (with which a reader
  could forge an operator's form) and the keyed lock keys' secret. A reader of a fleet on
  ``lock_keys="keyed"`` therefore cannot name who holds a session-mode lock (lease holders
  are in the leases table, which it reads).

Creating the ledger needs CREATE on its schema (and CREATE on the database only when the
schema is missing); upgrading it needs ownership of its tables: that is the ledger owner's,
who runs ``python -m cronlock migrate`` and the statements printed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .tables import LedgerTable, quote_ident

__all__ = (
    "MISSING_PRIVILEGES_SQL",
    "ROLES",
    "SCHEMA_USAGE_SQL",
    "Grant",
    "Role",
    "grant_statements",
    "missing_privileges",
    "role_grants",
)

Role = Literal["replica", "operator", "reader"]
"""Who connects: the replicas, the operators (their tools and dashboard), the readers."""
ROLES: tuple[Role, ...] = ("replica", "operator", "reader")

_ALL = ("SELECT", "INSERT", "UPDATE", "DELETE")
_UPSERT = ("SELECT", "INSERT", "UPDATE")
# What a replica does with the leases table in each mode: reads it (a session-mode replica
# leaves lease-mode claims alone), or claims and renews leases in it.
_LEASES: dict[str, tuple[str, ...]] = {"session": ("SELECT",), "lease": _UPSERT}


@dataclass(frozen=True, slots=True)
class Grant:
    """Privileges on one of the ledger's tables (*table* quoted and qualified); *columns*
    given: on those columns only."""

    privileges: tuple[str, ...]
    table: str
    columns: tuple[str, ...] = ()


def _reads(table: LedgerTable) -> list[Grant]:
    """SELECT on every table but the secrets: what status, history, the schedules' list and
    the dashboard read (the conflicts from the definitions, the holders from the leases)."""
    names = (table.runs, table.jobs, table.control, table.leases, table.members)
    others = (table.schedules, table.definitions, table.slots)
    return [Grant(("SELECT",), name) for name in (*names, *others)]


def role_grants(
    table: LedgerTable,
    role: Role,
    *,
    mode: Literal["session", "lease"] = "session",
    keyed: bool = False,
) -> list[Grant]:
    """The privileges *role* needs on *table*'s ledger (besides USAGE on its schema); for a
    replica, in *mode*, and with *keyed* lock keys (``lock_keys="keyed"``: the secret the
    first replica makes)."""
    if role == "reader":
        return _reads(table)
    if role == "operator":
        return [
            *_reads(table),
            Grant(("INSERT", "UPDATE"), table.control),  # pause, resume, trigger
            Grant(("INSERT", "UPDATE", "DELETE"), table.jobs),  # retire; a removal's note
            Grant(("INSERT", "UPDATE"), table.schedules),  # the edits (and their row lock)
            Grant(("SELECT", "INSERT"), table.secrets),  # the dashboard's CSRF key
        ]
    grants = [
        Grant(_ALL, table.runs),  # claims, outcomes, crash takeovers, retention's pruning
        Grant(_UPSERT, table.jobs),  # the jobs' notes
        Grant(("SELECT",), table.control),  # pauses and triggers
        Grant(_LEASES[mode], table.leases),
        Grant(_ALL, table.members),  # heartbeats; leaving; the expired ones' cleanup
        Grant(_ALL, table.definitions),  # its definitions; a gone replica's cleanup
        Grant(_ALL, table.slots),  # the fates of slots that did not run; their pruning
        Grant(("SELECT",), table.schedules),  # the stored schedules' sync
        Grant(("UPDATE",), table.schedules, ("problems", "problem_revision")),
    ]
    if keyed:
        grants.append(Grant(("SELECT", "INSERT"), table.secrets))
    return grants


def grant_statements(
    table: LedgerTable,
    roles: dict[Role, str],
    *,
    mode: Literal["session", "lease"] = "session",
    keyed: bool = False,
) -> list[str]:
    """``GRANT`` statements (no parameters) that give each role of *roles* (a part, and the
    name of its database role) what :func:`role_grants` lists, with USAGE on the schema (a
    comment when *table* names none: the schema is the search path's)."""
    lines: list[str] = []
    for part, name in roles.items():
        grantee = quote_ident(name, field=f"the {part} role")
        lines.append(f"-- {part}")
        if table.quoted_schema is None:
            lines.append(
                f"-- and USAGE on the schema the ledger is in: GRANT USAGE ON SCHEMA ... TO "
                f"{grantee};"
            )
        else:
            lines.append(f"GRANT USAGE ON SCHEMA {table.quoted_schema} TO {grantee};")
        for grant in _merged(role_grants(table, part, mode=mode, keyed=keyed)):
            what = ", ".join(grant.privileges)
            if grant.columns:
                what += f" ({', '.join(quote_ident(c) for c in grant.columns)})"
            lines.append(f"GRANT {what} ON TABLE {grant.table} TO {grantee};")
    return lines


def _merged(grants: list[Grant]) -> list[Grant]:
    """*grants* with one entry per table (and columns), its privileges in the usual order."""
    merged: dict[tuple[str, tuple[str, ...]], set[str]] = {}
    for grant in grants:
        merged.setdefault((grant.table, grant.columns), set()).update(grant.privileges)
    return [
        Grant(tuple(p for p in _ALL if p in privileges), table, columns)
        for (table, columns), privileges in merged.items()
    ]


MISSING_PRIVILEGES_SQL = """
    SELECT t.privilege, t.name, t.col FROM unnest($1::text[], $2::text[], $3::text[])
                                    WITH ORDINALITY AS t(privilege, name, col, n)
    WHERE to_regclass(t.name) IS NOT NULL
      AND NOT CASE WHEN t.col = '' THEN has_table_privilege(t.name, t.privilege)
                   ELSE has_column_privilege(t.name, t.col, t.privilege) END
    ORDER BY t.n"""
"""Arrays ``$1`` privileges, ``$2`` quoted table names, ``$3`` columns (``''``: the whole
table): those the session's role lacks, in the order given (a table that does not resolve
is left out). Run only once the schema's USAGE is known (else the names do not resolve)."""

SCHEMA_USAGE_SQL = """
    SELECT CASE WHEN EXISTS (SELECT FROM pg_namespace WHERE nspname = $1::text)
                THEN has_schema_privilege($1::text, 'USAGE') END"""
"""``$1`` a schema's name (unquoted): whether the session's role may use it; NULL when there
is no such schema."""


async def missing_privileges(
    conn: Any,
    table: LedgerTable,
    role: Role,
    *,
    mode: Literal["session", "lease"] = "session",
    keyed: bool = False,
) -> list[str]:
    """What *role*'s grants (:func:`role_grants`) give that the session's role lacks, each as
    ``INSERT on "s"."t_control"`` (``USAGE on schema "s"`` alone when that is missing: the
    tables cannot be looked at without it). Two catalog reads; tables missing are left out."""
    if table.schema is not None:
        usage = await conn.fetchval(SCHEMA_USAGE_SQL, table.schema)
        if usage is None:
            return []  # no such schema: the ledger is missing, not a privilege
        if not usage:
            return [f"USAGE on schema {table.quoted_schema}"]
    wanted = [
        (privilege, grant.table, column)
        for grant in role_grants(table, role, mode=mode, keyed=keyed)
        for privilege in grant.privileges
        for column in grant.columns or ("",)
    ]
    rows = await conn.fetch(
        MISSING_PRIVILEGES_SQL,
        [p for p, _, _ in wanted],
        [t for _, t, _ in wanted],
        [c for _, _, c in wanted],
    )
    missing: dict[tuple[str, str], list[str]] = {}
    for privilege, name, column in rows:
        missing.setdefault((privilege, name), []).append(column)
    return [
        f"{privilege}{' (' + ', '.join(cols) + ')' if any(cols) else ''} on {name}"
        for (privilege, name), cols in missing.items()
    ]
