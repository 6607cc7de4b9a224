"""PostgresLocker and the replica side's machinery: claims, batches, holds, upkeep,
membership, crash checks. Never imports the operators' side (``_ops``).

Re-exports nothing: import the module that defines a name.
"""
