#!/usr/bin/env bash
# Issue 33 item 3 on one GPU: the BRIEF §5 grid for three retrieval variants, in one run of
# the same code on the same machine (planned in session 11, run in session 15 on an H100:
# docs/benchmarks.md "GPU, session 15").
#
#   MODEL=/tmp/qwen.gguf bash scripts/gpu/grid33.sh RES_DIR
#
# Qwen2.5-Coder-0.5B-Instruct, -c 32768 --kvmem-budget 4096 --kvmem-gen-reserve 512
# --kv-dtype f16 -ngl all, greedy. Variants of retrieval (the only method whose figures
# depend on them): default, s3584 (--kvmem-stream-tokens 3584), b64-s3584
# (--kvmem-block-tokens 64 --kvmem-stream-tokens 3584). Steps, each in RES_DIR/STEP/
# (JSON, stdout.txt, progress.log):
#   needle-LAYOUT-LENGTH-base        full, recency, compact-rag (default flags), once
#   needle-LAYOUT-LENGTH-VARIANT     retrieval with the variant's flags
#     LAYOUT in tools, agent, document; LENGTH in 28672, 16384, 8192;
#     passkey + multikey, 2 seeds x 5 depths (20 cases a cell)
#   fidelity-VARIANT                 the 28K transcript, teacher-forced; default also runs
#                                    recency and writes the full-context reference that the
#                                    other two reuse (--reference-cache)
#   agent-FINAL-base / -VARIANT      agent memory (3 episodes of 28,672), FINAL user | tool
# Resumable: a step whose JSON is complete is skipped. JOBS needle/agent steps run at a time
# (default 7, -t THREADS each, default 2) beside the fidelity chain (1, then 2 processes).
# LAYOUTS (space-separated; default "tools agent document", "raw" too) sets the needle layouts.
# ONLY (an extended regex) runs the steps whose names match; FID_RECENCY= (empty) leaves
# recency out of the first fidelity step (its figures do not depend on the variants).
# CPU smoke run (SmolLM2, 1K cases; the figures mean nothing): MODEL=<SmolLM2 gguf> NGL=0
# CTX=4096 BUDGET=512 RESERVE=128 STREAM=384 LENGTHS=1024 KINDS=passkey SEEDS=1 DEPTHS=1
# EPISODES=1 AGENT_TOKENS=1024 FID_TOKENS=1536 JOBS=1 THREADS=1 ONLY='agent-1024|fidelity'.
set -u
RES=${1:?usage: grid33.sh RES_DIR}
MODEL=${MODEL:-/tmp/qwen.gguf}
JOBS=${JOBS:-7}
T=${THREADS:-2}
PY=${PYTHON:-python3}
REF=${REF:-/tmp/fidelity-ref}
export OMP_NUM_THREADS=$T
ONLY=${ONLY:-.}
S=${STREAM:-3584}
ENGINE="-m $MODEL -ngl ${NGL:-all} -t $T -c ${CTX:-32768} --kvmem-budget ${BUDGET:-4096}"
ENGINE+=" --kvmem-gen-reserve ${RESERVE:-512} --kv-dtype f16"
GRID="--kinds ${KINDS:-passkey,multikey} --seeds ${SEEDS:-2} --depths ${DEPTHS:-5} --no-plots"
FID_TOKENS=${FID_TOKENS:-28672}
declare -A FLAGS=(
  [default]=""
  [s3584]="--kvmem-stream-tokens $S"
  [b64]="--kvmem-block-tokens 64"
  [b64-s3584]="--kvmem-block-tokens 64 --kvmem-stream-tokens $S"
  [fuse]="--kvmem-lexical fuse"
  [b64-s3584-fuse]="--kvmem-block-tokens 64 --kvmem-stream-tokens $S --kvmem-lexical fuse"
  [b64-s3584-df10]="--kvmem-block-tokens 64 --kvmem-stream-tokens $S --kvmem-lexical-max-df 0.1"
  [b2048]="-b 2048"
  [b1024-s3584]="-b 1024 --kvmem-stream-tokens $S"
  [b768-s3840]="-b 768 --kvmem-stream-tokens 3840"
  [b512-s4096]="-b 512 --kvmem-stream-tokens 4096"
  [b1024-s3584-b64]="-b 1024 --kvmem-stream-tokens $S --kvmem-block-tokens 64"
  [nb1]="--kvmem-neighbor-blocks 1"
  [rerank]="--kvmem-rank rerank"
  [compact]="--kvmem-positions compact"
  [gather]="--kvmem-positions gather"
  [recompute]="--kvmem-recompute retrieved"
  [rc3]="--kvmem-recompute retrieved --kvmem-recompute-above 3"
)
# VARIANTS (space-separated names of FLAGS; the first writes the fidelity reference). Since
# lexical fusion became the default (session 16), default = fuse and b64-s3584 = b64-s3584-fuse;
# since session 20 default = compact, and gather is session 19's default.
read -r -a VARIANTS <<<"${VARIANTS:-default s3584 b64-s3584}"

is_done() {
  "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d.get("complete", True) else 1)' \
    "$1" 2>/dev/null
}

step() { # NAME JSON ARGS...: one kvmem-bench command into RES/NAME
  local name=$1 json=$2 dir=$RES/$1 t0 rc
  shift 2
  [[ $name =~ $ONLY ]] || return 0
  if is_done "$dir/$json"; then echo "[$name] done already"; return 0; fi
  mkdir -p "$dir"
  t0=$(date +%s)
  echo "[$name] start: kvmem-bench $*"
  # shellcheck disable=SC2068
  "$PY" -m kvmem.bench.main --progress $@ --out "$dir" >"$dir/stdout.txt" 2>"$dir/progress.log"
  rc=$?
  echo "[$name] rc=$rc in $(($(date +%s) - t0)) s"
  return $rc
}

fidelity_chain() {
  local fid="fidelity $ENGINE --target-tokens $FID_TOKENS --reference-cache $REF"
  mkdir -p "$REF"
  local first=${VARIANTS[0]} v
  step "fidelity-$first" fidelity.json $fid --methods "retrieval${FID_RECENCY-,recency}" ${FLAGS[$first]}
  for v in "${VARIANTS[@]:1}"; do
    step "fidelity-$v" fidelity.json $fid --methods retrieval ${FLAGS[$v]} &
  done
  wait
}

queue() { # one line per step: NAME|JSON|ARGS
  local len layout final v
  for len in ${LENGTHS:-28672 16384 8192}; do
    for layout in ${LAYOUTS:-tools agent document}; do
      local needle="needle $ENGINE $GRID --layouts $layout --lengths $len"
      echo "needle-$layout-$len-base|needle.json|$needle --methods full,recency,compact-rag"
      for v in "${VARIANTS[@]}"; do
        echo "needle-$layout-$len-$v|needle.json|$needle --methods retrieval ${FLAGS[$v]}"
      done
    done
  done
  for final in user tool; do
    local agent="agent $ENGINE --episodes ${EPISODES:-3} --target-tokens ${AGENT_TOKENS:-28672} --final $final"
    echo "agent-$final-base|agent.json|$agent --methods full,recency,compact-rag"
    for v in "${VARIANTS[@]}"; do
      echo "agent-$final-$v|agent.json|$agent --methods retrieval ${FLAGS[$v]}"
    done
  done
}

mkdir -p "$RES"
T0=$(date +%s)
fidelity_chain &
while IFS='|' read -r name json args; do
  while [ "$(jobs -rp | wc -l)" -gt "$JOBS" ]; do wait -n; done # the chain holds one slot
  # shellcheck disable=SC2086
  step "$name" "$json" $args &
done < <(queue)
wait
echo "grid: $(($(date +%s) - T0)) s"
touch "$RES/ALL_DONE"
