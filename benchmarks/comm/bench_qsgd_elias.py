"""QSGD's payload on real gradients: fixed-width codes against the paper's Elias coding.

    python benchmarks/comm/bench_qsgd_elias.py          # ~1 minute on 2 cores

The gradients of one real batch (seeded) of the two CPU-scale models of pipelines/dgc_qsgd: the
small VGG (width 0.25) on 128 CIFAR-10 images and the 2-layer 64-wide LSTM on 64 PTB windows of 20
words. Each tensor is quantized once per bit width (l2 norm, buckets of 512, the same generator
state for both encodings, so both carry the same codes) and encoded both ways; bits are counted
from the wire tensors. Also times encode (compress) and decode (decompress) per step on one
thread. Writes benchmarks/results/qsgd_elias.md and prints it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from common.compressors import build_compressor  # noqa: E402
from common.compressors.base import CompressorRNG  # noqa: E402
from trainer.data import load_dataset  # noqa: E402
from trainer.fileio import atomic_write_text  # noqa: E402
from trainer.models import build_model  # noqa: E402
from trainer.tracking import git_sha  # noqa: E402


def gradients(task: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    if task == "cifar":
        data = load_dataset("cifar10", "train", limit=128)
        model = build_model("vgg_small", num_classes=10, in_channels=3, image_size=32, width=0.25)
        x, y = data.get_batch(torch.arange(128))
        loss = torch.nn.functional.cross_entropy(model(x), y)
    else:
        data = load_dataset("ptb", "train", limit=64, seq_len=20)
        model = build_model(
            "lstm_lm", vocab_size=data.info.vocab_size, embed_dim=64, hidden_dim=64, dropout=0.0
        )
        x, y = data.get_batch(torch.arange(64))
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def measure(grads: dict[str, torch.Tensor], bits: int, encoding: str) -> dict[str, float]:
    compressor = build_compressor("qsgd", bits=bits, bucket_size=512, norm="l2", encoding=encoding)
    rng = CompressorRNG(seed=0, rank=0)
    start = time.perf_counter()
    payloads = [compressor.compress(g, rng) for g in grads.values()]
    encode = time.perf_counter() - start
    start = time.perf_counter()
    decoded = [compressor.decompress(p) for p in payloads]
    decode = time.perf_counter() - start
    numel = sum(g.numel() for g in grads.values())
    return {
        "bits_per_entry": sum(p.num_bits for p in payloads) / numel,
        "encode_ms": 1e3 * encode,
        "decode_ms": 1e3 * decode,
        "checksum": float(sum(d.double().sum() for d in decoded)),
        "numel": numel,
    }


def main() -> None:
    torch.set_num_threads(1)
    lines = [
        "# QSGD payload on real gradients: fixed width against Elias coding\n",
        f"`python benchmarks/comm/bench_qsgd_elias.py` at git {git_sha()}; one real batch's gradients, "
        "l2 norm, buckets of 512, one thread; bits counted from the wire tensors (fp32 norm per bucket "
        "included). Decode = one rank's payload; a step decodes every rank's.\n",
        "| model | entries | bits | fixed: bits / entry | Elias: bits / entry | Elias vs fixed "
        "| fixed encode / decode (ms) | Elias encode / decode (ms) | same codes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for task, label in (("cifar", "small VGG (0.25) / CIFAR-10"), ("ptb", "LSTM 2 x 64 / PTB")):
        grads = gradients(task)
        for bits in (2, 4, 8):
            fixed, elias = measure(grads, bits, "fixed"), measure(grads, bits, "elias")
            lines.append(
                f"| {label} | {fixed['numel']:,} | {bits} | {fixed['bits_per_entry']:.3f} "
                f"| {elias['bits_per_entry']:.3f} | {elias['bits_per_entry'] / fixed['bits_per_entry']:.2f}x "
                f"| {fixed['encode_ms']:.1f} / {fixed['decode_ms']:.1f} "
                f"| {elias['encode_ms']:.1f} / {elias['decode_ms']:.1f} "
                f"| {fixed['checksum'] == elias['checksum']} |"
            )
    text = "\n".join(lines) + "\n"
    atomic_write_text(REPO / "benchmarks" / "results" / "qsgd_elias.md", text)
    print(text)


if __name__ == "__main__":
    main()
