#!/usr/bin/env bash
# Everything a GPU machine should check, in one go, on one GPU (never in CI); each step has its own
# timeout (at most 14.5 minutes in all):
#   1. the GPU tests (the compiled Triton kernels against their references): pytest -m gpu
#   2. every kernel benchmark, compiled (benchmarks/kernels/run_all.sh -> results/kernels.csv)
#   3. the paper-scale models' step time through GradientSync on NCCL (results/gpu_models.md)
#   4. a DDP step with every compression method against no hook, with its kernel launches, syncs
#      and host reads, at world size 1 (results/gpu_ddp_step.md, .csv; under 5 minutes)
# Logs go to benchmarks/results/gpu_run_all.log. On the device machine:
#
#   bash benchmarks/gpu/run_all.sh            # sets up .venv if needed
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
python="${PYTHON:-$repo/.venv/bin/python}"
if [ ! -x "$python" ]; then
    make setup >/dev/null || { echo "make setup failed"; exit 1; }
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_INTERPRET=0
log="$repo/benchmarks/results/gpu_run_all.log"
status=0
{
    echo "== $(date -u +%FT%TZ) git $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    "$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'NO GPU')"
    echo "== pytest -m gpu"
    timeout 180 "$python" -m pytest -q -m gpu -p no:cacheprovider tests/kernels || status=1
    echo "== kernel benchmarks"
    timeout 180 bash benchmarks/kernels/run_all.sh --repeats 9 || status=1
    echo "== paper-scale models on NCCL"
    gpus="$("$python" -c 'import torch; print(max(torch.cuda.device_count(), 1))')"
    timeout 180 "$python" -m torch.distributed.run --standalone --nproc_per_node "$gpus" \
        benchmarks/gpu/bench_models.py --steps 10 --warmup 3 || status=1
    echo "== DDP step with every compression method on NCCL"
    timeout 330 "$python" -m torch.distributed.run --standalone --nproc_per_node 1 \
        benchmarks/gpu/bench_ddp_step.py || status=1
    echo "== done, status $status"
} 2>&1 | tee "$log"
exit $status
