#!/bin/sh
# Regenerates the committed sample: the trace (kvscope generate: English prompts tokenized by
# Mistral 7B's tokenizer, which mistral_common ships), its replayed run (with token ids and
# that tokenizer's name, so the app shows prompts as text), the
# same trace replayed with block size 32 in the same memory (for the Compare runs page), and
# as a hybrid model of gpt-oss's shape would hold it (full and 128-token sliding-window
# groups, for the KV cache groups page), and with a CPU tier of twice the GPU pool behind it
# (vLLM's own OffloadingConnector in the Scheduler, for the tier's pages); the last three
# without token ids, to keep them small (their key-free fingerprints still tell every missed
# token's cause). Every replay takes vLLM's own Scheduler (the default timing) at the trace's
# arrival times.
# The tenants are synthetic, so their names are kept (--reveal-tenants); the fixed key makes
# the salt pseudonyms the same on every machine. --no-advise: advice kept in a run is served
# only to the kvscope that worked it out (collector/advisor/stored.py), so a committed sample's
# would be stale at the next change of the code; `kvscope advise RUN` keeps it in a copy.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
rm -f "$here/trace.jsonl.gz" "$here/run.duckdb" "$here/run_block32.duckdb" \
    "$here/run_hybrid.duckdb" "$here/run_tier.duckdb"
kvscope generate --out "$here/trace.jsonl.gz" --seed 7
KVSCOPE_SECRET=kvscope-sample kvscope replay "$here/trace.jsonl.gz" --out "$here/run.duckdb" \
    --block-size 16 --num-blocks 1200 --max-num-seqs 32 \
    --record-token-ids --tokenizer mistral_common:data/tokenizer.model.v1 \
    --reveal-tenants --check-collisions --quiet --json --no-advise
KVSCOPE_SECRET=kvscope-sample kvscope replay "$here/trace.jsonl.gz" \
    --out "$here/run_block32.duckdb" \
    --block-size 32 --num-blocks 600 --max-num-seqs 32 \
    --reveal-tenants --check-collisions --quiet --json --no-advise
KVSCOPE_SECRET=kvscope-sample kvscope replay "$here/trace.jsonl.gz" \
    --out "$here/run_hybrid.duckdb" --kv-layout gpt-oss \
    --block-size 16 --num-blocks 1500 --max-num-seqs 32 \
    --reveal-tenants --check-collisions --quiet --json --no-advise
KVSCOPE_SECRET=kvscope-sample kvscope replay "$here/trace.jsonl.gz" \
    --out "$here/run_tier.duckdb" --cpu-tier-blocks 2400 \
    --block-size 16 --num-blocks 1200 --max-num-seqs 32 \
    --reveal-tenants --check-collisions --quiet --json --no-advise
