#!/bin/bash
# wait.sh SECONDS TOKEN: waits (at most SECONDS) for the orchestrator's phase TOKEN, then packs
# the run folders and logs into $OUT and prints where things stand.
F=/tmp/fx; end=$((SECONDS + $1))
while ! grep -q "^$2 " $F/phase 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 5; done
[ -d /tmp/runs ] && tar czf $OUT/run.tgz -C /tmp/runs .
tar czf $OUT/logs.tgz -C /tmp fx
echo "== phase (now $(date +%s))"; cat $F/phase
for f in $F/warm_*.log; do echo "== $f: $(tail -n 2 $f | tr '\n' ' ')"; done
for f in main1 main2; do [ -f $F/$f.log ] && { echo "== $f"; tail -n 8 $F/$f.log; }; done
cat /tmp/runs/*/manifest.json 2>/dev/null | python3 -c "import json,sys; print([(n['name'],n['status'],n.get('seconds')) for n in json.load(sys.stdin)['notebooks']])"
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
