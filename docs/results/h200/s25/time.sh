#!/usr/bin/env bash
# GPU cost of --kvmem-recompute retrieved: needle tools/agent 28K, multikey, 1 seed x 5 depths,
# full and retrieval (recompute off, retrieved), one process at a time, alone on the GPU.
set -u
[ -f /tmp/build.log ] && eval "$(grep '^export LD_PRELOAD' /tmp/build.log | tail -1)"
export PYTHONPATH=$PWD/src:/tmp/rcsite PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
E=${E:-"-m /tmp/qwen.gguf -ngl all -t 4 -c 32768 --kvmem-budget 4096 --kvmem-gen-reserve 512 --kv-dtype f16"}
G=${G:-"--kinds multikey --seeds 1 --depths 5 --lengths 28672 --no-plots"}
mkdir -p /tmp/res
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/device.txt 2>&1
for L in ${LAYOUTS:-tools agent}; do
  for V in ${VARIANTS:-full off retrieved}; do
    if [ $V = full ]; then M="--methods full"; else M="--methods retrieval --kvmem-recompute $V"; fi
    t0=$(date +%s%N)
    ${PY:-python3} -m kvmem.bench.main needle $E $G --layouts $L $M --kvmem-trace \
      --out /tmp/res/$L-$V > /tmp/res/$L-$V.out 2> /tmp/res/$L-$V.err
    echo "$L $V rc=$? wall_ms=$(( ($(date +%s%N) - t0) / 1000000 ))" | tee -a $OUT/time.txt
  done
done
tar czf $OUT/res.tgz -C /tmp res
