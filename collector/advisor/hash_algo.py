"""The prefix-cache hash: a non-cryptographic one (xxhash) with several tenants is a risk.

A block is reused whenever its hash matches; with a fast non-cryptographic hash a tenant
can craft a prompt whose blocks collide with another tenant's and be served their KV
(wrong output, or the other tenant's content leaking into the answer).
"""

from __future__ import annotations

from collector.advisor.context import RunContext
from collector.advisor.suggestion import Suggestion
from collector.queries.tenants import num_tenants

NON_CRYPTOGRAPHIC = ("xxhash", "xxhash_cbor")


def hash_algorithm(context: RunContext) -> list[Suggestion]:
    """Fire for xxhash when the run serves two or more tenants."""
    algorithm = context.config["hash_algo"]
    tenants = num_tenants(context.run)
    if algorithm not in NON_CRYPTOGRAPHIC or tenants < 2:
        return []
    replacement = "sha256_cbor" if algorithm.endswith("_cbor") else "sha256"
    return [
        Suggestion(
            rule="hash-algorithm",
            title=f"{algorithm} prefix-cache hashes with {tenants} tenants",
            severity="high",
            evidence=[
                f"the run hashes blocks with {algorithm}, a fast non-cryptographic hash",
                f"{tenants} tenants share one cache; kvscope's independent fingerprints saw "
                f"{context.summary['collisions']} collisions in this run (a crafted one "
                "would not show up until it is used)",
            ],
            effect=(
                "block hashes no tenant can collide on purpose; hit ratio unchanged (the same "
                "blocks match), a little more CPU per block hashed"
            ),
            action=f"`--prefix-caching-hash-algo {replacement}`",
            figures={"hash_algo": algorithm, "tenants": tenants},
        )
    ]
