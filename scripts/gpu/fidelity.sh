#!/usr/bin/env bash
# Issue 14's fidelity protocol on the H200: Qwen2.5-Coder-0.5B ($QWEN_GGUF), the 28K
# transcript (23 turns, 796 tokens scored), teacher-forced, KL(full || kvmem) and top-1
# against the full context. The default, the best variants of the CPU study and recency
# once. Phase 1 runs the default alone and keeps the full-context reference logits
# (--reference-cache); phase 2 runs the other variants in parallel against that reference.
# Prints one table and writes "$OUT"/fidelity.json (the per-variant JSON under
# "$OUT"/<variant>/). CPU smoke run: FID_MODEL=SmolLM2.gguf FID_NGL=0 FID_CTX=4096
# FID_BUDGET=512 FID_RESERVE=128 FID_TARGET=3000 FID_TOOL_SIZE=4 FID_THREADS=1.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT to the output directory}
MODEL=${FID_MODEL:-${QWEN_GGUF:?set QWEN_GGUF to the Qwen2.5-Coder-0.5B GGUF}}
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=${FID_THREADS:-3} OPENBLAS_NUM_THREADS=${FID_THREADS:-3}
mkdir -p "$OUT"
REF=$(mktemp -d /tmp/fidelity-ref.XXXXXX)
trap 'rm -rf "$REF"' EXIT
COMMON=(-m "$MODEL" -ngl "${FID_NGL:-all}" -t "${FID_THREADS:-3}" -c "${FID_CTX:-32768}"
  --kvmem-budget "${FID_BUDGET:-4096}" --kvmem-gen-reserve "${FID_RESERVE:-512}" --kv-dtype f16
  --target-tokens "${FID_TARGET:-28672}" --tool-size "${FID_TOOL_SIZE:-12}"
  --reference-cache "$REF")
# name|methods|flags (the first one runs alone and writes the reference)
VARIANTS=(
  "default|retrieval|"
  "recency|recency|"
  "b64-s3584|retrieval|--kvmem-block-tokens 64 --kvmem-stream-tokens 3584"
  "rerank|retrieval|--kvmem-rank rerank"
  "exact-b64-s3584|retrieval|--kvmem-rank exact --kvmem-block-tokens 64 --kvmem-stream-tokens 3584"
  "rerank-b64-s3584|retrieval|--kvmem-rank rerank --kvmem-block-tokens 64 --kvmem-stream-tokens 3584"
)
BUDGET_S=${FID_TOTAL_S:-290}  # the whole script's limit: phase 2 gets what phase 1 left
run_variant() {  # limit_s name methods flags
  local limit=$1 name=$2 methods=$3 flags=$4
  # shellcheck disable=SC2086
  timeout "$limit" "$PY" -m kvmem.bench.main fidelity "${COMMON[@]}" \
    --methods "$methods" $flags --out "$OUT/$name" >"$OUT/$name.log" 2>&1 \
    || echo "variant $name failed (rc $?), see $OUT/$name.log"
}
t0=$(date +%s)
IFS='|' read -r name methods flags <<<"${VARIANTS[0]}"
run_variant 150 "$name" "$methods" "$flags"
left=$(( BUDGET_S - ($(date +%s) - t0) )); (( left >= 60 )) || left=60
echo "phase 1 ($name, with the reference): $(( $(date +%s) - t0 )) s"
pids=()
for v in "${VARIANTS[@]:1}"; do
  IFS='|' read -r name methods flags <<<"$v"
  run_variant "$left" "$name" "$methods" "$flags" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
echo "all variants: $(( $(date +%s) - t0 )) s"
"$PY" - "$OUT" "${VARIANTS[@]}" <<'PYEOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows, result = [], {}
for spec in sys.argv[2:]:
    name, methods, flags = spec.split("|")
    path = out / name / "fidelity.json"
    if not path.exists():
        result[name] = {"flags": flags, "error": f"no {path}"}
        rows.append(f"{name:<18} {'failed':>8}")
        continue
    data = json.loads(path.read_text())
    by = {(s["method"], s["scope"]): s for s in data["overall"]}
    a, o = by[(methods, "all")], by[(methods, "over_budget")]
    result[name] = {"flags": flags, "method": methods, "all": a, "over_budget": o,
                    "transcript": data["transcript"], "seconds": data["seconds"]}
    def num(v, pct=False):
        return "-" if v is None else (f"{100 * v:.1f}%" if pct else f"{v:.3f}")
    rows.append(f"{name:<18} {num(a['mean_kl']):>8} {num(a['top1_agreement'], True):>7} "
                f"{num(o['mean_kl']):>8} {num(o['top1_agreement'], True):>7} "
                f"{num(a['mean_coverage']):>6} {data['seconds']:>6.0f}s  {flags}")
print(f"{'variant':<18} {'mean KL':>8} {'top-1':>7} {'ob KL':>8} {'ob top1':>7} {'cov':>6} "
      f"{'time':>7}  flags")
print("\n".join(rows))
(out / "fidelity.json").write_text(json.dumps(result, indent=2))
print(f"wrote {out / 'fidelity.json'}")
PYEOF
