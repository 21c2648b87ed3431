#!/bin/bash
# tools/plans/issue34-h.txt on one H200 (nvidia-h200; the four-GPU plan issue34-g was not lent): issue 31's
# prequantize probes first, then issue 34's BF16 30M, D/N = 25 seed 1 (lease_sweeps.sh sets OUT, LEASE_STATE and
# LEASE_DEADLINE). One thing at a time on the GPU, so the probes' step times are not shared.
#   1. nvidia_nvfp4's 125M step with its projection weights quantized in the loop, before it, and before it unrolled
#      (about 6 minutes);
#   2. quartet2's and ms_fp4's in the loop and before it (about 4 minutes);
#   3. the slow model test on this GPU with the kernels on: prequantized weights give the same loss and gradients
#      (nvidia_nvfp4, quartet, quartet2, ms_fp4; about 5 minutes);
#   4. BF16 30M, D/N = 25 seed 1 (about 8 minutes).
set -u -o pipefail
source tools/plans/lease_lib.sh
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.75
UNROLLED=1 BITS=0 bash benchmarks/gpu_suite.sh prequantize
RECIPES=quartet2,ms_fp4 BITS=0 bash benchmarks/gpu_suite.sh prequantize
SKIP_INSTALL=1 timeout 360 python -m pytest -v -m "slow or not slow" -p no:cacheprovider \
  tests/experiments/test_exp_model.py -k change_how_not_what > "$OUT/prequantize_bits.log" 2>&1
lease_sweep bf30r25 --sizes 30M --ratios 25 --recipes bf16 --seeds 1 --devices 0
