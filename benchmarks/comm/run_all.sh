#!/usr/bin/env bash
# Communication benchmarks on CPU gloo ranks: collectives vs message size at 2 and 4 ranks, the
# step-time overhead of GradientSync(identity) against DDP at 2 and 4 ranks, and the two profiles
# that explain the overheads (GradientSync's sync alone; all_gather_variable's extra passes).
#
#   benchmarks/comm/run_all.sh                 # from anywhere; uses the repository's .venv
#   TORCHRUN=torchrun benchmarks/comm/run_all.sh
#
# Appends to benchmarks/results/comm_collectives.csv and comm_sync_overhead.csv and rewrites
# comm_collectives.png, comm_sync_overhead.md, comm_sync_profile.md, comm_all_gather_profile.md and
# suite_step.md (every suite method's CIFAR-10 step against fp32's), compressors.md and ddp_hooks.md. About 3 + 12 + 5 + 3 + 2 + 1 + 10 minutes on a 2-core machine. Extra arguments go to every script (so only shared ones: --no-write).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
torchrun="${TORCHRUN:-$repo/.venv/bin/torchrun}"
python="${PYTHON:-$repo/.venv/bin/python}"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=1

echo "load before: $(uptime)"
for n in 2 4; do
    "$torchrun" --standalone --nproc_per_node "$n" benchmarks/comm/bench_collectives.py "$@"
done
for n in 2 4; do
    "$torchrun" --standalone --nproc_per_node "$n" benchmarks/comm/bench_sync_overhead.py "$@"
done
"$torchrun" --standalone --nproc_per_node 2 benchmarks/comm/profile_sync.py "$@"
"$torchrun" --standalone --nproc_per_node 4 benchmarks/comm/profile_sync.py --append "$@"
"$torchrun" --standalone --nproc_per_node 2 benchmarks/comm/profile_all_gather.py "$@"
"$torchrun" --standalone --nproc_per_node 2 benchmarks/comm/bench_suite_step.py "$@"
"$torchrun" --standalone --nproc_per_node 4 benchmarks/comm/profile_all_gather.py --append "$@"
"$python" benchmarks/comm/bench_compressors.py "$@"  # per call against GRACE's algorithms (compressors.md)
for n in 2 4; do  # torch's fp16 and PowerSGD hooks against thinwire's (ddp_hooks.md)
    "$torchrun" --standalone --nproc_per_node "$n" benchmarks/comm/bench_ddp_hooks.py --models resnet18 mobilenet_v2 "$@"
done
echo "load after: $(uptime)"
