#!/bin/bash
# tools/plans/issue34-i.txt on one H200 (nvidia-h200), when the four-GPU plan issue34-g is not lent (lease_sweeps.sh
# sets OUT, LEASE_STATE and LEASE_DEADLINE). One thing at a time on the GPU:
#   1. issue 31's open question about prequantize_weights: quartet2's 125M step in the loop and prequantized, with the
#      kernels and with XLA's quantizers (its losses after the timed steps differed with the kernels in the lease of
#      2026-11-28; about 6 minutes);
#   2. the slow model test on this GPU: prequantized weights give the same loss and gradients (nvidia_nvfp4, quartet,
#      quartet2, ms_fp4; up to 12 minutes; it timed out at quartet2 after 6 minutes in that lease);
#   3. BF16 30M, D/N = 25 seed 2 (about 8 minutes).
set -u -o pipefail
source tools/plans/lease_lib.sh
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.75
RECIPES=quartet2 XLA=1 BITS=0 bash benchmarks/gpu_suite.sh prequantize
SKIP_INSTALL=1 STEP=0 bash benchmarks/gpu_suite.sh prequantize
lease_sweep bf30r25 --sizes 30M --ratios 25 --recipes bf16 --seeds 2 --devices 0
