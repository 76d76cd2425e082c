#!/usr/bin/env bash
# Every kernel benchmark in one go (GPU if present, else CPU), appending to
# benchmarks/results/kernels.csv. Extra arguments go to every script (e.g. --no-csv, --repeats 9,
# --log2-max 25).
#
#   benchmarks/kernels/run_all.sh                 # from anywhere; uses the repository's .venv
#   PYTHON=python3 benchmarks/kernels/run_all.sh --no-csv
#
# About 5 minutes on a 2-core CPU; a few minutes on one GPU.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
python="${PYTHON:-$repo/.venv/bin/python}"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
# The benchmarks time compiled kernels; the interpreter (set by the test suite) would time numpy.
export TRITON_INTERPRET=0

for op in pack_bits ternarize qsgd_quantize threshold_select ef_update masked_compact; do
    echo "== bench_$op"
    "$python" "benchmarks/kernels/bench_$op.py" "$@"
done
