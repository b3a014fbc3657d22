#!/usr/bin/env bash
# Issue 11 on one GPU, in one run (< 3 minutes), printing the tables and writing
# "$OUT"/hybrid.json (plus each step's own JSON under "$OUT"/hybrid/):
#  1. prompt lookup: Qwen2.5-Coder-0.5B ($QWEN_GGUF) answers an agent turn that rewrites a
#     file it was shown, greedily, without and with ngram drafts (`kvmem-bench lookup-drafts`,
#     --n-draft 3 = the --spec-draft-n-max default): decode speedup and acceptance rate;
#  2. MTP decode overhead at (near) zero acceptance on a reduced-depth near-27B synthetic
#     qwen35 with one nextn layer (the 27b preset's layer shapes, HYBRID_LAYERS trunk layers,
#     random weights: its drafts are rejected): decode tok/s without drafts and with
#     --spec-type draft-mtp (3-token drafts, f16 draft KV) through the KVMem session, same
#     run, same loaded model (`kvmem-bench mtp-overhead`; outputs must be identical;
#     HYBRID_MTP_GATE=on|off|closed picks the draft gate, default on);
#  3. hybrid decode at HYBRID_CTX tokens (default 131072; HYBRID_CTX=262144 is the issue's
#     256K if the prefill fits the time) with the KVMem window HYBRID_BUDGET against stock
#     llama.cpp at the window size, same run (`kvmem-bench decode-sweep`).
# Each step has its own timeout (40 + 40 + 40 + 60 s); a failed step is reported and skipped.
# CPU smoke run: HYBRID_CPU=1 QWEN_GGUF=<SmolLM2 gguf> OUT=/tmp/h scripts/gpu/hybrid.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT to the output directory}
QWEN=${QWEN_GGUF:?set QWEN_GGUF to the Qwen2.5-Coder-0.5B GGUF}
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if [[ -n ${HYBRID_CPU:-} ]]; then
  PRESET=(--preset tiny) LAYERS=${HYBRID_LAYERS:-4} CTX=${HYBRID_CTX:-4096}
  BUDGET=${HYBRID_BUDGET:-1024} TOKENS=${HYBRID_TOKENS:-48} NGL=0 FUNCS=4 MTP_PROMPT=256
  THREADS=1  # CPU flash attention rounds single rows and batches alike only on one thread
else
  PRESET=(--preset 27b) LAYERS=${HYBRID_LAYERS:-8} CTX=${HYBRID_CTX:-131072}
  BUDGET=${HYBRID_BUDGET:-32768} TOKENS=${HYBRID_TOKENS:-256} NGL=all FUNCS=24 MTP_PROMPT=1024
  THREADS=4
fi
STEPS="$OUT/hybrid"
mkdir -p "$STEPS"/lookup "$STEPS"/mtp "$STEPS"/sweep
BENCH=("$PY" -m kvmem.bench.main)
echo "== 1. prompt lookup on $(basename "$QWEN")"
timeout 40 "${BENCH[@]}" lookup-drafts -m "$QWEN" --n-draft 3 --functions "$FUNCS" \
  --max-tokens "$TOKENS" -ngl "$NGL" --out "$STEPS/lookup" || echo "step 1 failed"
HYB=${HYBRID_GGUF:-$STEPS/qwen35-${LAYERS}l-mtp.gguf}
if [[ ! -f $HYB ]]; then
  echo "== writing the synthetic hybrid ($LAYERS trunk layers + 1 nextn layer)"
  timeout 40 "${BENCH[@]}" synth-model --arch qwen35 "${PRESET[@]}" --n-layer "$LAYERS" \
    --nextn-layers 1 --weights q8_0 --distinct-chunks 64 ${HYBRID_TOKENIZER:+--tokenizer-from "$HYBRID_TOKENIZER"} "$HYB"
fi
MTP_HYB=$HYB
if [[ -n ${HYBRID_MTP_LAYERS:-} && ${HYBRID_MTP_LAYERS} != "$LAYERS" ]]; then
  MTP_HYB=$STEPS/qwen35-${HYBRID_MTP_LAYERS}l-mtp.gguf  # e.g. the preset's whole depth
  echo "== writing the synthetic hybrid for step 2 ($HYBRID_MTP_LAYERS trunk layers + 1 nextn)"
  timeout 90 "${BENCH[@]}" synth-model --arch qwen35 "${PRESET[@]}" --n-layer "$HYBRID_MTP_LAYERS" \
    --nextn-layers 1 --weights q8_0 --distinct-chunks 64 ${HYBRID_TOKENIZER:+--tokenizer-from "$HYBRID_TOKENIZER"} "$MTP_HYB" || MTP_HYB=$HYB
fi
echo "== 2. MTP decode overhead (draft-mtp vs no drafts) on $(basename "$MTP_HYB")"
timeout "${HYBRID_MTP_TIMEOUT:-40}" "${BENCH[@]}" mtp-overhead -m "$MTP_HYB" --n-draft 3 --prompt-tokens "$MTP_PROMPT" \
  --max-tokens "$TOKENS" -c 8192 --budget 4096 --gen-reserve 1024 -t "$THREADS" \
  --gate "${HYBRID_MTP_GATE:-on}" -ngl "$NGL" --out "$STEPS/mtp" || echo "step 2 failed"
echo "== 3. hybrid decode at $CTX (window $BUDGET) against stock at the window size"
timeout "${HYBRID_SWEEP_TIMEOUT:-60}" "${BENCH[@]}" decode-sweep -m "$HYB" --contexts "$CTX" --configs kvmem \
  --budget "$BUDGET" --gen-reserve 1024 --gen-tokens 64 -ngl "$NGL" --out "$STEPS/sweep" || echo "step 3 failed"
"$PY" - "$STEPS" "$OUT/hybrid.json" <<'PYEOF'
import json, pathlib, sys
steps, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
payload = {p.parent.name: json.loads(p.read_text()) for p in sorted(steps.glob("*/*.json"))}
out.write_text(json.dumps(payload, indent=2))
print("wrote", out, "with", ", ".join(payload))
PYEOF
