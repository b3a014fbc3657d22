#!/usr/bin/env bash
# Issue 33's raw completion prompts on Qwen, on one GPU, with grid33.sh (session 17b):
# the lab scale (the cpu preset: -c 16384 --kvmem-budget 2048, 14,336-token prompts) and
# the 32K protocol's lengths, full / recency / compact-rag / retrieval; beside them the
# document-16K multikey case every variant missed (depth 0.5, seed 1), with the needle's
# block forced into the window (--oracle) and without.
#   bash raw33.sh RES_DIR      (then: python3 scripts/gpu/grid33_table.py RES_DIR/raw32k)
set -u
RES=${1:?usage: raw33.sh RES_DIR}
HERE=$(dirname "$0")
export LAYOUTS=raw ONLY=needle-raw JOBS=${JOBS:-9}
CTX=16384 BUDGET=2048 RESERVE=256 LENGTHS=14336 VARIANTS="default" \
  bash "$HERE/grid33.sh" "$RES/raw-lab" &
VARIANTS="default b64-s3584-df10" bash "$HERE/grid33.sh" "$RES/raw32k" &
case_args="-m ${MODEL:-/tmp/qwen.gguf} -ngl all -t 2 -c 32768 --kvmem-budget 4096
  --kvmem-gen-reserve 512 --kv-dtype f16 --kinds multikey --seeds 1 --first-seed 1
  --depths 5 --no-plots --layouts document --lengths 16384 --methods retrieval"
for tag in oracle plain; do
  extra=$([ $tag = oracle ] && echo --oracle)
  mkdir -p "$RES/doc16k-$tag"
  # shellcheck disable=SC2086
  KVMEM_TRACE=1 python3 -m kvmem.bench.main --progress needle $case_args $extra \
    --out "$RES/doc16k-$tag" >"$RES/doc16k-$tag/stdout.txt" 2>"$RES/doc16k-$tag/progress.log" &
done
wait
touch "$RES/ALL_DONE"
