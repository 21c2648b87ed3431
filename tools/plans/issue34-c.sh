#!/bin/bash
# The one-GPU share of tools/plans/issue34-h200-c.txt: 10M, D/N = 10, QuEST nearest seeds 0 and 1 (their quartet
# pairs ran in issue34-x2-b.txt at the same commit), then quartet and QuEST nearest seed 2 (about 2.5 minutes a run).
set -u -o pipefail
source tools/plans/lease_lib.sh
lease_sweep quest10n --sizes 10M --ratios 10 --recipes fp4jax_experiments.ablations:quartet_quest_nearest \
  --seeds 0 1 --devices 0
lease_sweep quest10s2 --sizes 10M --ratios 10 --recipes quartet fp4jax_experiments.ablations:quartet_quest_nearest \
  --seeds 2 --devices 0
