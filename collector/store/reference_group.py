"""The reference group of a run: the KV cache group whose blocks the prefix rollups count,
its first full-attention group, else group 0 (rollups.py)."""

from __future__ import annotations

REFERENCE_GROUP_STATEMENT = """
CREATE OR REPLACE TABLE reference_group AS
SELECT coalesce(list_position(
    CAST(json_extract_string(options, '$.kv_groups[*].kind') AS VARCHAR[]), 'full') - 1, 0
) AS kv_group
FROM runs
"""
# Block rows of the reference group (of a run's event rows, `events` named so).
IN_REFERENCE_GROUP = "coalesce(kv_group, 0) = (SELECT kv_group FROM reference_group)"
