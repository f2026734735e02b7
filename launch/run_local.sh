#!/usr/bin/env bash
# Ring attention on one machine: N ranks (default: one per core), one OpenMP thread each.
#   launch/run_local.sh N --input F --output G [run options...]
set -euo pipefail
n=${1:?usage: run_local.sh N run-options...}; shift
exec mpirun --oversubscribe --bind-to core -np "$n" -x OMP_NUM_THREADS=1 \
  "$(dirname "$0")/../build/bin/ringattn" run "$@"
