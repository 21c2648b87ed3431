#!/bin/bash
# What tools/plans/issue31-m.txt runs on one H200 (lease_sweeps.sh sets OUT, LEASE_STATE and LEASE_DEADLINE), issue
# 31 only, one thing at a time:
#   1. the 125M step of every recipe with the defaults beside the anchor (gpu_suite.sh defaults, about 5 minutes;
#      at 4f5c6bc quartet2's default step compiled in 65 s, over the 60 s target, before the device time ended);
#   2. ms_fp4 and quartet unrolled against their layer loop at 125M (gpu_suite.sh unroll; the loop's memcpys cost
#      ms_fp4 4.2 ms of its 62 ms step; both compile in 23-35 s in the loop), the unrolled step under the threefry
#      kernel lowering (ModelConfig.threefry_kernel="auto");
#   3. in the time left (at least 3 minutes): where quartet2's 125M compile goes, its default (the layer loop)
#      first, then unrolled (benchmarks/compile_profile.py writes its document after each variant).
set -u -o pipefail
CUDA_VISIBLE_DEVICES=0 SKIP_INSTALL=1 bash benchmarks/gpu_suite.sh defaults
CUDA_VISIBLE_DEVICES=0 SKIP_INSTALL=1 MODEL=125M RECIPES=ms_fp4,quartet bash benchmarks/gpu_suite.sh unroll
left=$(( LEASE_DEADLINE - $(date +%s) - 20 ))
[ "$left" -ge 180 ] || { echo "issue31-m: ${left} s left, no compile profile"; exit 0; }
CUDA_VISIBLE_DEVICES=0 timeout "$left" python benchmarks/compile_profile.py --recipe quartet2 --top 80 \
  --variants '{"default": {}, "unrolled": {"scan_unroll": 12}}' --out "$OUT/compile_profile_quartet2.json" \
  > "$OUT/compile_profile_quartet2.log" 2>&1
