#!/bin/bash
# GPU 0's share of tools/plans/issue34-x2-i.txt (two H200s; lease_sweeps.sh sets OUT, LEASE_STATE and
# LEASE_DEADLINE), one thing at a time: steps 0 and 1 of tools/plans/issue34-n.sh (div_rn's GPU tests, ms_fp4's 125M
# step in the loop and unrolled), then nvidia_nvfp4 at 50M, D/N = 10, seed 0 (about 12.5 minutes) where 13.5 are
# left, and BF16 at 50M, seed 1 where 9 are left.
set -u -o pipefail
source tools/plans/lease_lib.sh
bash tools/plans/issue34-n.sh --probes-only
lease_sweep_if_time 810 nv50r10s0 --sizes 50M --ratios 10 --recipes nvidia_nvfp4 --seeds 0 --devices 0
lease_sweep_if_time 540 bf50r10s1 --sizes 50M --ratios 10 --recipes bf16 --seeds 1 --devices 0
