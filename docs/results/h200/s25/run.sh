#!/usr/bin/env bash
# Session 25 on one H100, one process at a time (docs/benchmarks.md "Session 25"); the two
# scripts that ran there (needle, then fidelity), merged.
#   OUT=DIR bash run.sh needle     needle 28K per layout: full, retrieval with --kvmem-recompute
#                                  off and retrieved (LAYOUTS, VARIANTS, G override)
#   OUT=DIR bash run.sh fidelity   the 28K transcript: retrieval past 3 budgets, then the default,
#                                  against one full-context reference
set -u
[ -f /tmp/build.log ] && eval "$(grep '^export LD_PRELOAD' /tmp/build.log | tail -1)"
export PYTHONPATH=$PWD/src:/tmp/rcsite PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
E=${E:-"-m /tmp/qwen.gguf -ngl all -t 4 -c 32768 --kvmem-budget 4096 --kvmem-gen-reserve 512 --kv-dtype f16"}
KB="${PY:-python3} -m kvmem.bench.main"
mkdir -p /tmp/res

timed() {  # NAME COMMAND...: run, log the wall time
  local name=$1 t0; shift; t0=$(date +%s%N)
  "$@" > /tmp/res/$name.out 2> /tmp/res/$name.err
  echo "$name rc=$? wall_ms=$(( ($(date +%s%N) - t0) / 1000000 ))" | tee -a $OUT/time.txt
}

needle() {
  local G=${G:-"--kinds passkey,multikey --seeds 2 --depths 5 --lengths 28672 --no-plots"} L V M
  for L in ${LAYOUTS:-tools agent document raw}; do
    for V in ${VARIANTS:-full off retrieved}; do
      if [ $V = full ]; then M="--methods full"; else M="--methods retrieval --kvmem-recompute $V"; fi
      timed $L-$V $KB needle $E $G --layouts $L $M --kvmem-trace --out /tmp/res/$L-$V
    done
  done
  tar czf $OUT/res.tgz -C /tmp res
}

fidelity() {
  local V X
  for V in rc3 off; do
    X=""; [ $V = rc3 ] && X="--kvmem-recompute retrieved --kvmem-recompute-above 3"
    timed fid-$V $KB fidelity $E ${F:-"--target-tokens 28672"} --reference-cache /tmp/fref \
      --methods retrieval $X --kvmem-trace --out /tmp/res/fid-$V
    cp /tmp/res/fid-$V/fidelity.json $OUT/fidelity-$V.json
  done
}

"${1:?needle or fidelity}"
