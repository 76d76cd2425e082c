"""Decode and verify a data set once, and record what was decoded (the DVC ``prepare_data`` stage).

    python -m pipelines.prepare_data mnist

The decoded arrays live in the git-ignored cache (``.cache/`` or ``$THINWIRE_CACHE``); this stage
writes ``results/data/<name>.json`` (split sizes and a content digest of each split) so training
stages depend on the decoded data, and a changed or corrupt source shows up as a changed digest
or a failed stage.
"""

from __future__ import annotations

import argparse
import hashlib

import torch

from harness.entry import quiet_environment, setup_logging
from harness.folders import RESULTS_DIR
from trainer.data import SPLITS, load_dataset
from trainer.fileio import atomic_write_json


def digest(dataset) -> str:
    x, y = dataset.get_batch(torch.arange(len(dataset)))
    h = hashlib.sha256()
    h.update(x.contiguous().numpy().tobytes())
    h.update(y.contiguous().numpy().tobytes())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dataset")
    args = parser.parse_args(argv)
    quiet_environment()
    setup_logging()
    record = {}
    for split in SPLITS:
        dataset = load_dataset(args.dataset, split)
        record[split] = {"examples": len(dataset), "sha256": digest(dataset)}
    record["info"] = {k: v for k, v in vars(load_dataset(args.dataset, "test").info).items()}
    atomic_write_json(RESULTS_DIR / "data" / f"{args.dataset}.json", record)
    print(record)


if __name__ == "__main__":
    main()
