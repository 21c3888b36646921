#!/bin/sh
# GPU smoke test of live capture (needs a GPU, vLLM and network access to the model hub):
# `kvscope collect` in the background, `vllm serve` of a small model with kvscope's plugin
# switched on, a few hundred requests sharing prefixes (three tenants, labelled through
# vllm_xargs), then checks on the run file. Usage: .ci/gpu_smoke.sh [MODEL] [REQUESTS]
set -eu
cd "$(dirname "$0")/.."
model=${1:-Qwen/Qwen2.5-0.5B-Instruct}
requests=${2:-300}
port=${PORT:-8011}
work=$(mktemp -d)
run="$work/run.duckdb"
endpoint="ipc://$work/kvscope.ipc"
bin=.venv/bin

"$bin/kvscope" collect --db "$run" --endpoint "$endpoint" --live-interval 2 &
collector=$!
KVSCOPE_CAPTURE=1 KVSCOPE_ENDPOINT="$endpoint" KVSCOPE_CHECK_COLLISIONS=1 \
    "$bin/vllm" serve "$model" --host 127.0.0.1 --port "$port" --enable-prefix-caching \
    --max-model-len 4096 --gpu-memory-utilization 0.5 > "$work/vllm.log" 2>&1 &
server=$!
trap 'kill $server $collector 2>/dev/null || true' EXIT

for _ in $(seq 1 180); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    sleep 2
done
grep -q "kvscope: capturing block events" "$work/vllm.log" || {
    echo "kvscope did not attach inside vllm serve; log: $work/vllm.log"; exit 1; }

"$bin/python" - "$port" "$model" "$requests" <<'PYTHON'
import json, random, sys, urllib.request
port, model, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(7)
systems = {t: f"You are the {t} assistant. " + " ".join(rng.choice(["policy", "rule", "note",
           "detail"]) for _ in range(300)) for t in ("acme", "globex", "initech")}
for i in range(count):
    tenant = rng.choice(list(systems))
    body = {"model": model, "max_tokens": 16, "temperature": 0,
            "prompt": systems[tenant] + f"\nQuestion {rng.randrange(50)}: what applies?",
            "vllm_xargs": {"kvscope_tenant": tenant}}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                     json.dumps(body).encode(), {"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=120).read()
print(f"sent {count} requests")
PYTHON

kill -TERM $server; wait $server || true
kill -TERM $collector; wait $collector
trap - EXIT
"$bin/kvscope" summary "$run" --json | tee "$work/summary.json"
"$bin/python" - "$work/summary.json" "$requests" <<'PYTHON'
import json, sys
summary = json.load(open(sys.argv[1])); expected = int(sys.argv[2])
assert summary["requests"] >= expected, summary
assert summary["token_hit_ratio"] > 0.5, summary
assert summary["dropped_events"] == 0 and summary["collisions"] == 0, summary
print("gpu smoke: ok")
PYTHON
