#!/usr/bin/env bash
# The real-model protocol of ../shared/BRIEF.md §5 on one GPU, every measure in one run:
# Qwen2.5-Coder-0.5B-Instruct (-m qwen-0.5b), -c 32768 --kvmem-budget 4096
# --kvmem-gen-reserve 512, f16 KV, greedy, all layers on the GPU.
#
#   scripts/gpu-protocol.sh OUT_DIR [STEP ...]     # default: every step; see `list` below
#   scripts/gpu-protocol.sh OUT_DIR list           # the steps, and which are done
#
# Steps (each writes OUT_DIR/STEP/*.json plus progress.log and stdout.txt):
#   needle-{document,tools,agent}-{8192,16384,28672}  passkey+multikey, 2 seeds x 5 depths,
#                                                     full / retrieval / recency
#   oracle-{tools,agent}-28672   retrieval with --oracle (the needle's blocks forced in;
#                                needs KVMemSession.force_spans)
#   agent-user, agent-tool       agent memory, 3 episodes at ~32K, full/retrieval/recency/lastn;
#                                the question as the final user turn / as a tool result
#   fidelity-28672               teacher-forced KL and top-1 on the 28K transcript
#   tools                        only with PROTOCOL_TOOLS=1: kvmem-server -m qwen-0.5b and the
#                                tool benchmark against it (30K tokens, 16 rounds)
#
# Resumable: a step whose JSON is complete is skipped, so rerunning after a stop redoes only
# the unfinished steps. Steps run PROTOCOL_JOBS at a time (default 4: a 0.5B model leaves the
# GPU mostly idle, so parallel processes add throughput); each prints a line per case,
# prefixed with its step. Environment: KVMEM_BENCH (default .venv/bin/kvmem-bench),
# KVMEM_SERVER (default .venv/bin/kvmem-server), PROTOCOL_THREADS (-t per process, default 4),
# PROTOCOL_PORT (default 8090), PROTOCOL_FLAGS (engine flags added to every step, e.g.
# "--kvmem-query-source scoring"). For a small smoke run on a CPU, PROTOCOL_MODEL, _CTX, _BUDGET,
# _RESERVE, _DEPTHS, _SEEDS, _EPISODES and _AGENT_TOKENS override the protocol's values, and
# steps may name other lengths (needle-agent-1500, fidelity-3000).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/gpu-protocol.sh OUT_DIR [STEP ...|list]}
shift
BENCH=${KVMEM_BENCH:-.venv/bin/kvmem-bench}
SERVER=${KVMEM_SERVER:-.venv/bin/kvmem-server}
JOBS=${PROTOCOL_JOBS:-4}
THREADS=${PROTOCOL_THREADS:-4}
PORT=${PROTOCOL_PORT:-8090}
export OMP_NUM_THREADS=$THREADS
MODEL=${PROTOCOL_MODEL:-qwen-0.5b}
ENGINE=(-m "$MODEL" -ngl all -t "$THREADS" -c "${PROTOCOL_CTX:-32768}"
  --kvmem-budget "${PROTOCOL_BUDGET:-4096}" --kvmem-gen-reserve "${PROTOCOL_RESERVE:-512}"
  --kv-dtype f16)
# PROTOCOL_FLAGS: further engine flags for every step (a variant), split on spaces
read -r -a EXTRA <<<"${PROTOCOL_FLAGS:-}"
ENGINE+=("${EXTRA[@]}")
GRID=(--kinds passkey,multikey --seeds "${PROTOCOL_SEEDS:-2}" --depths "${PROTOCOL_DEPTHS:-5}"
  --no-plots)
LENGTHS=(28672 16384 8192)

all_steps() {
  for len in "${LENGTHS[@]}"; do
    for layout in tools agent document; do echo "needle-$layout-$len"; done
  done
  echo oracle-tools-28672 oracle-agent-28672 agent-user agent-tool fidelity-28672
  if [ "${PROTOCOL_TOOLS:-0}" = 1 ]; then echo tools; fi
}

json_of() {
  case $1 in
    needle-* | oracle-*) echo "$OUT/$1/needle.json" ;;
    agent-*) echo "$OUT/$1/agent.json" ;;
    fidelity-*) echo "$OUT/$1/fidelity.json" ;;
    tools) echo "$OUT/$1/tools_qwen.json" ;;
    *) echo "unknown step $1" >&2; return 2 ;;
  esac
}

is_done() {
  local file
  file=$(json_of "$1") || return 1
  [ -f "$file" ] && python3 - "$file" <<'EOF'
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    sys.exit(1)
sys.exit(0 if doc.get("complete", True) else 1)
EOF
}

tools_step() {
  local dir=$1
  "$SERVER" "${ENGINE[@]}" --port "$PORT" >"$dir/server.log" 2>&1 &
  local pid=$!
  "$BENCH" --progress tools --url "http://127.0.0.1:$PORT" --wait 300 --label qwen \
    --target-tokens 30000 --rounds 16 --gen-tokens 64 --server-pid "$pid" --out "$dir"
  local rc=$?
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  return $rc
}

set_command() { # CMD=(the step's command line)
  local step=$1 dir=$2 layout len
  case $step in
    needle-*)
      IFS=- read -r _ layout len <<<"$step"
      CMD=("$BENCH" --progress needle "${ENGINE[@]}" "${GRID[@]}" --layouts "$layout"
        --lengths "$len" --methods full,retrieval,recency --out "$dir") ;;
    oracle-*)
      IFS=- read -r _ layout len <<<"$step"
      CMD=("$BENCH" --progress needle "${ENGINE[@]}" "${GRID[@]}" --layouts "$layout"
        --lengths "$len" --methods retrieval --oracle --out "$dir") ;;
    agent-user | agent-tool)
      CMD=("$BENCH" --progress agent "${ENGINE[@]}" --episodes "${PROTOCOL_EPISODES:-3}"
        --target-tokens "${PROTOCOL_AGENT_TOKENS:-28672}"
        --final "${step#agent-}" --methods full,retrieval,recency,lastn --out "$dir") ;;
    fidelity-*)
      CMD=("$BENCH" --progress fidelity "${ENGINE[@]}" --target-tokens "${step#fidelity-}"
        --methods retrieval,recency --out "$dir") ;;
    tools) CMD=(tools_step "$dir") ;;
  esac
}

run_step() {
  local step=$1 dir="$OUT/$1" t0 rc
  if is_done "$step"; then
    echo "[$step] done already: $(json_of "$step")"
    return 0
  fi
  mkdir -p "$dir"
  set_command "$step" "$dir"
  t0=$(date +%s)
  echo "[$step] start: ${CMD[*]}"
  set +e
  "${CMD[@]}" 2>&1 >"$dir/stdout.txt" | tee "$dir/progress.log" | sed -u "s|^|[$step] |"
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" -eq 0 ]; then
    echo "[$step] finished in $(($(date +%s) - t0)) s: $(json_of "$step")"
  else
    echo "[$step] FAILED (exit $rc) after $(($(date +%s) - t0)) s: see $dir/progress.log"
  fi
  return "$rc"
}

if [ "${1:-}" = list ]; then
  for step in $(all_steps); do
    if is_done "$step"; then echo "done  $step"; else echo "todo  $step"; fi
  done
  exit 0
fi
STEPS=("$@")
if [ ${#STEPS[@]} -eq 0 ]; then mapfile -t STEPS < <(all_steps | tr ' ' '\n'); fi
for step in "${STEPS[@]}"; do json_of "$step" >/dev/null; done # reject unknown steps first

mkdir -p "$OUT"
if [ "$MODEL" = qwen-0.5b ]; then
  "$BENCH" models qwen-0.5b >/dev/null # join the model once, before the parallel steps
fi
T0=$(date +%s)
failed=0
for step in "${STEPS[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || failed=$((failed + 1)); done
  run_step "$step" &
done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || failed=$((failed + 1)); done
echo "protocol: ${#STEPS[@]} steps in $(($(date +%s) - T0)) s, $failed failed; results in $OUT"
"$BENCH" summarize "$OUT" >"$OUT/summary.txt" 2>&1 && echo "tables: $OUT/summary.txt"
[ "$failed" -eq 0 ]
