#!/usr/bin/env bash
# Issue 9 / 14 speed on the H200, 8B Llama shape (q8_0 weights and KV, flash attention):
# the scoring source with the query work beside the prefill (--kvmem-query-ahead on) against
# the same work after it (off), in one run each.
#
#   scripts/gpu/ahead.sh setup            CUDA build (../shared/gpu copied to .gpu/, ~5 min),
#                                         the 8B-shape model at /tmp/m8b.gguf, /tmp/env.sh
#   scripts/gpu/ahead.sh STEP [STEP ...]  ds32 | ds256 | ds32-hN | ds256-hN (--harvest-tokens N)
#                                         | tools-on | tools-off | tools-on-hN, into /tmp/res
#                                         (N default 8192, the flag's default),
#                                         then $OUT/res.tgz and the servers' traces;
#                                         SERVER_EXTRA adds server flags to a tools step and
#                                         TAG to its name (tools-on-TAG)
#
# Each call of the device tool lays the tree anew: carry .gpu (and the wheels in .whl:
# fastapi, starlette, pydantic, pydantic-core, uvicorn, annotated-types, annotated-doc,
# typing-inspection, opentelemetry-api, typing-extensions for Python 3.12); setup installs
# them to /tmp/site. Keep calls under 10 minutes: setup alone; ds32 + tools-on; tools-off +
# ds256. The trace's RESELECT records say ahead= (history length when the scores started)
# and score_wait_ms (what the turn waited for them).
set -u
cd "$(dirname "$0")/../.."
KB="python3 -m kvmem.bench.main"
M=(-m /tmp/m8b.gguf --kv-dtype q8_0 --budget 32768 --gen-reserve 4096)
if [ "${1:-}" = setup ]; then
  rm -rf /tmp/repo /tmp/g && mkdir -p /tmp/repo && cp -r src /tmp/repo/ && cp -r .gpu /tmp/g
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  t0=$(date +%s)
  bash /tmp/g/build-cuda.sh > /tmp/build.log 2>&1
  echo "build rc=$? $(($(date +%s) - t0))s"
  { grep "^export LD_PRELOAD" /tmp/build.log | tail -1
    echo "export PYTHONPATH=/tmp/site:/tmp/repo/src PYTHONUNBUFFERED=1"; } > /tmp/env.sh
  . /tmp/env.sh
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $KB synth-model /tmp/m8b.gguf --distinct-chunks 16 --tokenizer-from /tmp/g/tok-template.gguf
  exit $?
fi
. /tmp/env.sh
rm -rf /tmp/repo/src && cp -r src /tmp/repo/
mkdir -p /tmp/res
for step in "$@"; do
  t0=$(date +%s)
  case $step in
    ds32 | ds256 | ds32-h* | ds256-h*)  # -hN: --harvest-tokens N, the scoring source alone
      ctx=$([ "${step%%-*}" = ds32 ] && echo 32768 || echo 262144)
      harvest=8192 configs=kvmem-scoring  # the candidate default of --kvmem-harvest-tokens
      case $step in
        *-h*) harvest=${step#*-h} ;;
        ds32) configs=stock,kvmem-scoring,kvmem-scoring-after ;;
        *) configs=kvmem-scoring,kvmem-scoring-after ;;
      esac
      $KB decode-sweep "${M[@]}" --contexts "$ctx" --configs "$configs" \
        --harvest-tokens "$harvest" --out "/tmp/res/$step" > "/tmp/res/$step.txt" 2>&1
      tail -25 "/tmp/res/$step.txt" ;;
    tools-on | tools-off | tools-on-h*)  # -hN: --kvmem-harvest-tokens N (else $HARVEST)
      name=${step#tools-} harvest=${HARVEST:-8192}
      ahead=${name%%-*}
      name=$name${TAG:+-$TAG}
      case $step in *-h*) harvest=${step#*-h} ;; esac
      python3 -m kvmem.server.main -m /tmp/m8b.gguf -c 262144 --kv-dtype q8_0 -fa on \
        --metrics --port 8080 --kvmem-budget 32768 --kvmem-gen-reserve 4096 \
        --kvmem-query-source scoring --kvmem-query-ahead "$ahead" --kvmem-trace \
        --kvmem-harvest-tokens "$harvest" ${SERVER_EXTRA:-} \
        > "/tmp/res/server-$name.log" 2>&1 &
      pid=$!
      $KB tools --url http://127.0.0.1:8080 --wait 120 --ignore-eos \
        --label "kvmem-32k-ahead-$name" --server-pid $pid --out "/tmp/res/tools-$name" \
        > "/tmp/res/tools-$name.txt" 2>&1
      kill $pid
      wait $pid
      tail -45 "/tmp/res/tools-$name.txt" | cut -c1-220
      grep KVMEM_RESELECT "/tmp/res/server-$name.log" | sed 's/ sink=.*//' | tail -6
      gzip -kf "/tmp/res/server-$name.log" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
  echo "[$step $(($(date +%s) - t0))s]"
done
(cd /tmp/res && tar czf "$OUT/res.tgz" --exclude='*.log' . && cp server-*.log.gz "$OUT/" 2>/dev/null)
ls -la "$OUT"
