#!/bin/bash
# The whole GPU run of one device session (docs/notes/gpu-runs.md). Runs on the GPU machine,
# started with setsid so that it outlives the device call that starts it:
#   (setsid nohup bash tools/gpu_session/orchestrate.sh SHA > /tmp/fx/orch.log 2>&1 < /dev/null &)
# then follow-up calls `bash tools/gpu_session/wait.sh SECONDS PHASE` pack what is there into $OUT.
# It works on a copy of the tree in /tmp/fxrepo (the device tool re-sends the tree on each
# call); state and logs in /tmp/fx; the run folder in /tmp/runs. 00-02 (no timings) run beside
# cache warmers and the GPU tests that time nothing; the run is stopped when 03 starts and
# resumed, alone on the GPU, once the warmers are done (03, then 04; phase 03_done between).
SHA=$1
F=/tmp/fx
mkdir -p $F /tmp/runs
phase() { echo "$1 $(date +%s)" >> $F/phase; }
rm -rf /tmp/fxrepo && cp -a "$(cd "$(dirname "$0")/../.." && pwd)" /tmp/fxrepo && rm -rf /tmp/fxrepo/.device
cd /tmp/fxrepo
source /tmp/site/env.sh
export PYTHONPATH=/tmp/fxrepo:${PYTHONPATH:-} TORCHINDUCTOR_CACHE_DIR=/tmp/inductor TRITON_CACHE_DIR=/tmp/triton \
  FOXCUTE_GIT_COMMIT=$SHA PYTHONUNBUFFERED=1
phase start
setsid python3 -m foxcute run --preset h200 --out /tmp/runs --timeout-cell 900 > $F/main1.log 2>&1 &
MAIN=$!
status() { python3 -c "
import json,glob,sys
m=glob.glob('/tmp/runs/*/manifest.json')
d={n['name']:n['status'] for n in json.load(open(m[-1]))['notebooks']} if m else {}
print(d.get(sys.argv[1],'none'))" $1 2>/dev/null; }
until [ "$(status 00_tour)" = ok ] || ! kill -0 $MAIN 2>/dev/null; do sleep 2; done
phase 00_done
W=()
w() { local log=$1; shift; (timeout 400 "$@" > $F/warm_$log.log 2>&1; echo "rc=$?" >> $F/warm_$log.log) & W+=($!); }
for k in 0 1; do w tc$k python3 tools/gpu_session/warm.py layers torch_compile $k/2; done
for i in torch_compile torch_max_autotune torch_ops_compile; do w step_$i python3 tools/gpu_session/warm.py step $i; done
w sweep python3 tools/gpu_session/warm.py sweep
# 04's compile (minutes of max-autotune) only where 04 is to run this session: TRAIN=0 skips it
[ "${TRAIN:-1}" = 1 ] && w train python3 tools/gpu_session/warm.py train
# where each public function's host time goes (issue 31), cProfile's shares (beside other work:
# read the shares, not the times)
w hostprof python3 -m foxcute.lab.torch_ops --profile all
w test_c_export python3 -m pytest -q -p no:cacheprovider tests/test_gpu_c_export.py tests/test_gpu_export.py tests/test_gpu_curiosity.py
w test_train python3 -m pytest -q -p no:cacheprovider tests/test_gpu_train.py tests/test_train_ddp.py
until [ "$(status 03_profiling)" = running ] || ! kill -0 $MAIN 2>/dev/null; do sleep 2; done
kill -- -$MAIN 2>/dev/null; pkill -9 -f "[i]pykernel_launcher"; sleep 1
phase main_paused
wait "${W[@]}"
phase warm_done
D=$(ls -d /tmp/runs/*/ | tail -1)
python3 -m foxcute run --resume $D --timeout-cell 900 > $F/main2.log 2>&1 &
MAIN=$!
until [ "$(status 03_profiling)" = ok ] || ! kill -0 $MAIN 2>/dev/null; do sleep 2; done
phase 03_done
wait $MAIN
phase main_done
