#!/bin/bash
# tools/plans/issue34-x2-b.txt on two H200s: bash tools/plans/issue34-x2-b.sh all (lease_sweeps.sh sets OUT,
# LEASE_STATE and LEASE_DEADLINE). One process on a GPU at a time; each sweep's runs one after another.
# all: the issue-31 overlap probe on both GPUs (gpu_suite.sh overlap, about 5.5 minutes), then gpu0 and gpu1 side by
#   side until both end.
# gpu0: the issue-31 loop probes, alone on the GPU (about 6 minutes): the 125M nvidia_nvfp4 step's loop census
#   (compiled HLO, with and without command buffers) and its profile under both (copy kernels attributed to their
#   XLA ops); then 10M, D/N = 10, quartet and QuEST nearest, three seeds (about 2 minutes a run).
# gpu1: ms_fp4 at 30M, D/N = 10, seeds 0 and 1 (about 9.5 minutes a run).
set -u -o pipefail
source tools/plans/lease_lib.sh
case ${1:-} in
  all)
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.75 bash benchmarks/gpu_suite.sh overlap
    bash "$0" gpu0 &
    bash "$0" gpu1 &
    wait
    ;;
  gpu0)
    CUDA_VISIBLE_DEVICES=0 XLA_PYTHON_CLIENT_MEM_FRACTION=0.75 RECIPES=nvidia_nvfp4 FLAGSETS="none no_command_buffer" \
      bash benchmarks/gpu_suite.sh loop-copies
    CUDA_VISIBLE_DEVICES=0 XLA_PYTHON_CLIENT_MEM_FRACTION=0.75 RECIPES=nvidia_nvfp4 FLAGSETS="none no_command_buffer" \
      bash benchmarks/gpu_suite.sh loop-flags
    lease_sweep quest10 --sizes 10M --ratios 10 --recipes quartet fp4jax_experiments.ablations:quartet_quest_nearest \
      --seeds 0 1 2 --devices 0
    ;;
  gpu1)
    lease_sweep m30ms --sizes 30M --ratios 10 --recipes ms_fp4 --seeds 0 1 --devices 1
    ;;
  *) echo "issue34-x2-b.sh: say all, gpu0 or gpu1, got '${1:-}'" >&2; exit 2 ;;
esac
