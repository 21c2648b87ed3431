#!/bin/bash
# One GPU's share of tools/plans/issue34-x2-b.txt (two H200s: gpu0, gpu1) or issue34-x4-b.txt (four: gpu0-gpu3):
# bash tools/plans/issue34-b.sh gpuN (lease_sweeps.sh sets OUT, LEASE_STATE and LEASE_DEADLINE). One process on a GPU
# at a time; each sweep's runs one after another. Times are today's steps alone on an H200 (BENCHMARKS.md).
# gpu0: the issue-31 loop probes first, alone on the GPU (about 5 minutes): the 125M step's loop census (compiled
#   HLO; nvidia_nvfp4 with and without command buffers, quartet without; each module kept for the names in a
#   profile), then the nvidia_nvfp4 step's profile without command buffers (copy kernels attributed to their XLA
#   ops); then ms_fp4 at 30M, D/N = 10, seeds 0 and 1 (about 9.5 minutes a run).
# gpu1: the OCC-bounds benchmark (about 1.5 minutes: the Pallas select against the XLA one), then 10M, D/N = 10,
#   quartet and QuEST nearest, three seeds (about 2.5 minutes a run), then the 10M, D/N = 25 quartet seed 0 (about
#   6 minutes).
# gpu2: 30M, D/N = 25, bf16, three seeds (about 7 minutes a run).
# gpu3: the 10M, D/N = 25 quartet seed 2 (about 6 minutes), then 30M, D/N = 25, nvidia_nvfp4 seed 0 (about 15).
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
    CUDA_VISIBLE_DEVICES=1 bash benchmarks/gpu_suite.sh occ
    lease_sweep quest10 --sizes 10M --ratios 10 --recipes quartet fp4jax_experiments.ablations:quartet_quest_nearest \
      --seeds 0 1 2 --devices 1
    lease_sweep r25q0 --sizes 10M --ratios 25 --recipes quartet --seeds 0 --devices 1
    ;;
  gpu2)
    lease_sweep bf30r25 --sizes 30M --ratios 25 --recipes bf16 --seeds 0 1 2 --devices 2
    ;;
  gpu3)
    lease_sweep r25q2 --sizes 10M --ratios 25 --recipes quartet --seeds 2 --devices 3
    lease_sweep nv30r25 --sizes 30M --ratios 25 --recipes nvidia_nvfp4 --seeds 0 --devices 3
    ;;
  *) echo "issue34-b.sh: say gpu0, gpu1, gpu2 or gpu3, got '${1:-}'" >&2; exit 2 ;;
esac
