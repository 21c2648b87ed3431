#!/bin/bash
# GPU 0's share of tools/plans/issue34-k.txt (one H200), issue34-x2-f.txt and issue34-x4-f.txt (lease_sweeps.sh sets
# OUT, LEASE_STATE and LEASE_DEADLINE), one thing at a time on that GPU:
#   1. nvidia_nvfp4 30M, D/N = 25 seed 1 (issue 34; its stack unrolled by default since b7acecc: about 14 minutes);
#   2. issue 31: the 125M step of every recipe with the defaults beside the anchor (gpu_suite.sh defaults, about 5
#      minutes);
#   3. issue 31, in the time left (at least 4 minutes): where quartet2's unrolled 125M compile goes (it ran past 150 s
#      under the threefry kernel lowering, nvidia_nvfp4's took 25 s; benchmarks/compile_profile.py).
set -u -o pipefail
source tools/plans/lease_lib.sh
lease_sweep nv30r25s1 --sizes 30M --ratios 25 --recipes nvidia_nvfp4 --seeds 1 --devices 0
CUDA_VISIBLE_DEVICES=0 SKIP_INSTALL=1 bash benchmarks/gpu_suite.sh defaults
left=$(( LEASE_DEADLINE - $(date +%s) - 20 ))
[ "$left" -ge 240 ] || { echo "issue34-k: ${left} s left, no compile profile"; exit 0; }
CUDA_VISIBLE_DEVICES=0 timeout "$left" python benchmarks/compile_profile.py --recipe quartet2 --top 80 \
  --variants '{"unrolled": {"scan_unroll": 12}}' --out "$OUT/compile_profile_quartet2_unrolled.json" \
  > "$OUT/compile_profile_quartet2_unrolled.log" 2>&1
