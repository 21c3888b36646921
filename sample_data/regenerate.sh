#!/bin/sh
# Regenerates the committed sample: the trace (kvscope generate) and its replayed run.
# The tenants are synthetic, so their names are kept (--reveal-tenants); the fixed key makes
# the salt pseudonyms the same on every machine.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
rm -f "$here/trace.jsonl.gz" "$here/run.duckdb"
kvscope generate --out "$here/trace.jsonl.gz" --seed 7
KVSCOPE_SECRET=kvscope-sample kvscope replay "$here/trace.jsonl.gz" --out "$here/run.duckdb" \
    --block-size 16 --num-blocks 1200 --timing timestamps --max-num-seqs 32 \
    --record-token-ids --reveal-tenants --quiet --json
