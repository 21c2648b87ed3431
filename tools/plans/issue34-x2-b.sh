#!/bin/bash
# tools/plans/issue34-x2-b.txt on two H200s: bash tools/plans/issue34-x2-b.sh gpu0|gpu1 (lease_sweeps.sh sets OUT,
# LEASE_STATE and LEASE_DEADLINE). One process on a GPU at a time; each sweep's runs one after another.
# gpu0: the issue-31 loop probes first, alone on the GPU (about 5 minutes): the 125M step's loop census (compiled
#   HLO; nvidia_nvfp4 with and without command buffers, quartet without; each module kept for the names in a
#   profile), then the nvidia_nvfp4 step's profile without command buffers (copy kernels attributed to their XLA
#   ops); then ms_fp4 at 30M, D/N = 10, seeds 0 and 1 (about 9.5 minutes a run).
# gpu1: 10M, D/N = 10, quartet and QuEST nearest, three seeds (about 2.5 minutes a run), then the 10M, D/N = 25
#   quartet seed 0 (about 6 minutes).
set -u -o pipefail
source tools/plans/lease_lib.sh
case ${1:-} in
  gpu0)
    export CUDA_VISIBLE_DEVICES=0 XLA_PYTHON_CLIENT_MEM_FRACTION=0.75
    RECIPES=nvidia_nvfp4 FLAGSETS="none no_command_buffer" bash benchmarks/gpu_suite.sh loop-copies
    RECIPES=quartet FLAGSETS=none bash benchmarks/gpu_suite.sh loop-copies
    RECIPES=nvidia_nvfp4 FLAGSETS=no_command_buffer bash benchmarks/gpu_suite.sh loop-flags
    unset CUDA_VISIBLE_DEVICES XLA_PYTHON_CLIENT_MEM_FRACTION
    lease_sweep m30ms --sizes 30M --ratios 10 --recipes ms_fp4 --seeds 0 1 --devices 0
    ;;
  gpu1)
    lease_sweep quest10 --sizes 10M --ratios 10 --recipes quartet fp4jax_experiments.ablations:quartet_quest_nearest \
      --seeds 0 1 2 --devices 1
    lease_sweep r25q0 --sizes 10M --ratios 25 --recipes quartet --seeds 0 --devices 1
    ;;
  *) echo "issue34-x2-b.sh: say gpu0 or gpu1, got '${1:-}'" >&2; exit 2 ;;
esac
