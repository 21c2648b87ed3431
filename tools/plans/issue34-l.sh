#!/bin/bash
# GPU 0's share of tools/plans/issue34-l.txt (one H200), issue34-x2-g.txt and issue34-x4-g.txt (lease_sweeps.sh sets
# OUT, LEASE_STATE and LEASE_DEADLINE), one thing at a time on that GPU:
#   1. nvidia_nvfp4 30M, D/N = 25 seed 2 (issue 34; seed 1 took 13.3 minutes on one H200 at 4f5c6bc);
#   2. issue 31: the 125M step of every recipe with the defaults beside the anchor (gpu_suite.sh defaults, about 5
#      minutes; at 4f5c6bc quartet2's default step compiled in 65 s, over the 60 s target, before the device time
#      ended);
#   3. issue 31, in the time left (at least 3 minutes): where quartet2's 125M compile goes, its default (the layer
#      loop) first, then unrolled (over 150 s under the threefry kernel lowering; benchmarks/compile_profile.py
#      writes its document after each variant, so a cut-off unrolled one keeps the default's).
set -u -o pipefail
source tools/plans/lease_lib.sh
lease_sweep nv30r25s2 --sizes 30M --ratios 25 --recipes nvidia_nvfp4 --seeds 2 --devices 0
CUDA_VISIBLE_DEVICES=0 SKIP_INSTALL=1 bash benchmarks/gpu_suite.sh defaults
left=$(( LEASE_DEADLINE - $(date +%s) - 20 ))
[ "$left" -ge 180 ] || { echo "issue34-l: ${left} s left, no compile profile"; exit 0; }
CUDA_VISIBLE_DEVICES=0 timeout "$left" python benchmarks/compile_profile.py --recipe quartet2 --top 80 \
  --variants '{"default": {}, "unrolled": {"scan_unroll": 12}}' --out "$OUT/compile_profile_quartet2.json" \
  > "$OUT/compile_profile_quartet2.log" 2>&1
