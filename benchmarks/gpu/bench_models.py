"""Step time of the paper-scale models through GradientSync on NCCL, synthetic batches (GPU).

    torchrun --standalone --nproc_per_node <GPUs> benchmarks/gpu/bench_models.py      # GPU, NCCL
    torchrun --standalone --nproc_per_node 2 benchmarks/gpu/bench_models.py --tiny --no-write  # CPU check

A step: forward, backward (bf16 autocast, channels_last for the convolutional nets) and the
gradient sync, then SGD. Methods: fp32 all-reduce, and top-k 1 % + error feedback (on CUDA its
threshold kernels are Triton's). Models at their paper shapes: ResNet-50 (ImageNet, 224 x 224,
batch 64 per GPU), VGG-16-BN (CIFAR, 32 x 32, batch 128), the 2 x 1500 LSTM (PTB: vocabulary
10,000, 35 steps, batch 20) and GPT-2 small (12 x 768, 1,024 tokens, batch 4, vocabulary 50,257).
``--tiny`` shrinks every model and batch so that the script itself can be checked on CPU (gloo).
Writes ``benchmarks/results/gpu_models.md`` (median step ms over ``--steps`` after ``--warmup``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from common.comm import GradientSync
from common.compressors import build_compressor
from trainer.models import build_model

RESULTS = Path(__file__).resolve().parents[1] / "results" / "gpu_models.md"


def specs(tiny: bool) -> dict[str, dict[str, Any]]:
    """Model, its options, the input batch and whether it is a language model."""
    if tiny:
        return {
            "resnet50": {"options": {"num_classes": 10, "in_channels": 3, "image_size": 64}, "input": (2, 3, 64, 64)},
            "vgg16_bn": {"options": {"num_classes": 10, "in_channels": 3, "image_size": 32}, "input": (2, 3, 32, 32)},
            "lstm_lm": {"options": {"vocab_size": 100, "embed_dim": 16, "hidden_dim": 16}, "tokens": (2, 8, 100)},
            "gpt2_small": {"options": {"vocab_size": 100, "n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": 8},
                           "tokens": (2, 8, 100)},
        }  # fmt: skip
    return {
        "resnet50": {"options": {"num_classes": 1000, "in_channels": 3, "image_size": 224}, "input": (64, 3, 224, 224)},
        "vgg16_bn": {"options": {"num_classes": 10, "in_channels": 3, "image_size": 32}, "input": (128, 3, 32, 32)},
        "lstm_lm": {"options": {"vocab_size": 10000, "embed_dim": 1500, "hidden_dim": 1500, "num_layers": 2},
                    "tokens": (20, 35, 10000)},
        "gpt2_small": {"options": {"vocab_size": 50257, "n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024,
                                   "tied": False}, "tokens": (4, 1024, 50257)},
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["resnet50", "vgg16_bn", "lstm_lm", "gpt2_small"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="tiny shapes, to check the script on CPU")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if "RANK" not in os.environ:
        raise SystemExit("launch with torchrun (--standalone --nproc_per_node <GPUs>)")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    rows = []
    for name in args.models:
        spec = specs(args.tiny)[name]
        torch.manual_seed(0)
        model = build_model(name, **spec["options"]).to(device)
        g = torch.Generator(device=device).manual_seed(rank)
        if "input" in spec:
            model = model.to(memory_format=torch.channels_last)
            x = torch.randn(spec["input"], generator=g, device=device).contiguous(
                memory_format=torch.channels_last
            )
            y = torch.randint(
                0, spec["options"]["num_classes"], (spec["input"][0],), generator=g, device=device
            )
        else:
            batch, length, vocab = spec["tokens"]
            x = torch.randint(0, vocab, (batch, length), generator=g, device=device)
            y = torch.randint(0, vocab, (batch, length), generator=g, device=device)
        params = sum(p.numel() for p in model.parameters())
        for method in ("fp32", "topk1"):
            topk = method == "topk1"
            sync = GradientSync(
                build_compressor("topk", density=0.01) if topk else build_compressor("identity"),
                error_feedback=topk,
                compress_per_tensor=topk,
                bucket_numel=2**24,
            )
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
            times = []
            for step in range(args.warmup + args.steps):
                if cuda:
                    torch.cuda.synchronize()
                start = time.perf_counter()
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                    out = model(x)
                loss = nn.functional.cross_entropy(out.float().reshape(-1, out.shape[-1]), y.reshape(-1))
                loss.backward()
                sync.sync_gradients(model)
                optimizer.step()
                if cuda:
                    torch.cuda.synchronize()
                if step >= args.warmup:
                    times.append(time.perf_counter() - start)
            seconds = torch.tensor([statistics.median(times)], device=device)
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            bits = sync.stats.bits_sent / max(args.warmup + args.steps, 1)
            row = (
                f"| {name} | {params / 1e6:.1f} | {method} | {float(seconds) * 1e3:.1f} | {bits / 1e6:.1f} | "
                f"{loss.item():.3f} |"
            )
            rows.append(row)
            if rank == 0:
                print(row, flush=True)
        del model
        if cuda:
            torch.cuda.empty_cache()
    if rank == 0 and not args.no_write:
        gpu = torch.cuda.get_device_name(device) if cuda else "cpu"
        lines = [
            "# Paper-scale models: step time through GradientSync (synthetic batches)",
            "",
            f"`torchrun --standalone --nproc_per_node {world} benchmarks/gpu/bench_models.py "
            f"{' '.join(sys.argv[1:])}` on {world} x {gpu}, torch {torch.__version__}; the script's "
            "docstring says what a step is. Median step over the steps after the warm-up, the slowest rank's.",
            "",
            "| model | M params | method | step ms | Mbit sent / step / rank | last loss |",
            "|---|---:|---|---:|---:|---:|",
            *rows,
        ]
        RESULTS.write_text("\n".join(lines) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
