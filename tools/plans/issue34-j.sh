#!/bin/bash
# GPU 0's share of tools/plans/issue34-j.txt (one H200), issue34-x2-e.txt and issue34-g.txt (lease_sweeps.sh sets
# OUT, LEASE_STATE and LEASE_DEADLINE), one thing at a time on that GPU:
#   1. nvidia_nvfp4 30M, D/N = 25 seed 0 (issue 34; about 16 minutes alone on an H200);
#   2. issue 31: the 125M step with JAX's threefry as one kernel per call: nvidia_nvfp4 in the loop and unrolled,
#      quartet2 in the loop (about 7 minutes).
set -u -o pipefail
source tools/plans/lease_lib.sh
lease_sweep nv30r25 --sizes 30M --ratios 25 --recipes nvidia_nvfp4 --seeds 0 --devices 0
CUDA_VISIBLE_DEVICES=0 SKIP_INSTALL=1 bash benchmarks/gpu_suite.sh threefry
