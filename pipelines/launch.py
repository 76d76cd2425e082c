"""Validate a run's parameters, then start its ranks with torchrun (the DVC ``train`` stage).

    python -m pipelines.launch baseline fp32                          # into scratch/baseline/fp32
    python -m pipelines.launch baseline fp32 --out results/baseline/fp32   # what the DVC stage runs

Without ``--out`` a run goes to the git-ignored ``scratch/``: only DVC stages, which name their
folder, write under ``results/`` (a hand run at smoke scale once replaced a committed 98 % result
by a 30 % one).
Bad parameters fail here, before any worker starts, and so does a second launch on a run folder
that a running launch holds (:mod:`harness.runlock`), and a run folder that cannot be written. The
process then runs torchrun's own ``main`` (what the ``torchrun`` script runs, with torch imported
already: a smoke launch took 23.5 s against 24.4 s through a fresh ``torchrun``), so Ctrl-C and
DVC's signals reach torchrun, which stops its workers; a SIGKILL of it kills them too (they die
with their parent: :func:`trainer.distributed.die_with_parent`). A worker that dies is restarted up
to ``max_restarts`` times and resumes from the last verified checkpoint; a worker whose peer hangs
gives up after ``collective_timeout_s``. An error that a restart cannot fix (non-finite values, no
intact checkpoint, a full or read-only disk, bad options) is not retried: the launch ends at once,
its last line naming the rank and the cause (:mod:`harness.failures`, :func:`run_attempts`).

Over a slow network (needs root and iproute2; see :mod:`harness.netem`)::

    python -m pipelines.launch baseline fp32 --net-bandwidth 100mbit

starts each rank in its own network namespace behind a link shaped to that rate, restarts all
ranks when one fails (not for an error a restart cannot fix, as above), and removes the namespaces
on every exit path (success, failure, Ctrl-C, SIGTERM). ``--allow-unshaped`` runs plain torchrun instead where emulation is
unavailable (the run is tagged ``network=host``).

As a cluster of H hosts x G ranks (H x G = the run's ``world_size``)::

    python -m pipelines.launch suite mnist_fp32 --hosts 2 --ranks-per-host 2 --inter-host-bandwidth 1gbit

emulates H hosts (one namespace each; a host's ranks share its loopback, shaped with
``--intra-host-bandwidth`` if given) joined by links of the inter-host rate, and starts on each its
own ``torchrun --nnodes H --nproc_per_node G --rdzv-backend c10d --rdzv-endpoint <host 0>:29400``
agent, as on a cluster (:func:`harness.netem.run_hosts`; after a failed worker or a killed host's
agent every agent is started again and the run resumes from its last checkpoint, unless the error
is one a restart cannot fix).

Repeats of one run share one start-up (torchrun, imports, data, MLflow: ~30 s on 2 cores)::

    python -m pipelines.launch terngrad mnist_noclip --seeds 0,1,2 --out /tmp/mnist_noclip

trains seed 0, then 1, then 2 in the same ranks, into ``<out>/<run>/seed<k>/`` (one run or several:
the layout the evaluate stage reads). A rank that dies restarts
the whole list; seeds already finished are trained again (their checkpoints are complete, and a
complete checkpoint is never resumed), so the results do not depend on where a failure struck.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from harness import failures, netem
from harness.entry import quiet_environment
from harness.folders import artifacts_for
from harness.runlock import lock_run_folders
from pipelines.common import INPUTS_ENV
from pipelines.train import (
    OUT_DIR_ENV,
    RUN_NAME_ENV,
    SEED_ENV,
    SEEDS_ENV,
    STOP_AT_ENV,
    STRETCH_ENV,
    parse_runs,
    parse_seeds,
    parse_stop_at,
    parse_stretch,
    plan_repeats,
)
from trainer.data import load_dataset
from trainer.distributed import LAUNCHER_PID_ENV, RESTART_SAFE_ENV
from trainer.fileio import WriteError, check_writable


def torchrun_args(pipeline: str, run: str, scale: str | None, nproc: int, max_restarts: int) -> list[str]:
    """The arguments of ``torchrun`` (without the program) that start the run's ranks."""
    args = [
        "--standalone",
        f"--nproc_per_node={nproc}",
        f"--max-restarts={max_restarts}",
        "-m",
        "pipelines.train",
        # positional: torchrun's own parser would take `--run` for an abbreviation of `--run-path`
        pipeline,
        run,
    ]
    return args + (["--scale", scale] if scale else [])


def run_torchrun(args: list[str]) -> None:
    """``torchrun ARGS`` in this process: the elastic agent whose workers are ``python -m ...``
    subprocesses; a failed worker (after its restarts) raises torchrun's ``ChildFailedError``."""
    from torch.distributed.run import main as torchrun_main

    torchrun_main(args)


def run_attempts(args: list[str], max_restarts: int, failures_dir: str | os.PathLike[str]) -> int:
    """Run ``torchrun ARGS`` (without restarts of its own) up to ``max_restarts`` + 1 times; return
    0 once an attempt succeeds, else 1 after printing, last and once, the rank and the cause.

    After a failed attempt the ranks' records in ``failures_dir`` and their exit codes decide
    (:func:`harness.failures.verdict`): an error that a restart cannot fix (non-finite values,
    no intact checkpoint, a full or read-only disk, bad options) ends the launch at once; any other
    starts every rank again, resuming from the last verified checkpoint. torchrun's own restarts
    could not tell the two apart, and its failure block (``error_file: <N/A>``) named neither."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    attempts = max_restarts + 1
    line = ""
    for attempt in range(1, attempts + 1):
        failures.clear_records(failures_dir)
        try:
            run_torchrun(args)
            return 0
        except ChildFailedError as error:
            exits = {rank: failure.exitcode for rank, failure in error.failures.items()}
            retry, line = failures.verdict(failures.read_records(failures_dir), exits)
        sys.stdout.flush()
        if not retry:
            print(f"error: {line}. Not restarted: a restart would fail the same way", file=sys.stderr)
            return 1
        if attempt < attempts:
            print(
                f"launch: attempt {attempt} of {attempts} failed ({line}); restarting every rank "
                "from the last checkpoint",
                file=sys.stderr,
            )
    print(f"error: {line} (in each of {attempts} attempts: max_restarts is {max_restarts})", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "pipeline", help="a folder of pipelines/ with a params.yaml, or the path of your own such folder"
    )
    parser.add_argument(
        "run", help="a key of that params.yaml's `runs`, or several (a,b,c) trained one after the other"
    )
    parser.add_argument("--scale", default=None, help="override params.yaml's `scale`")
    parser.add_argument(
        "--net-bandwidth",
        default=None,
        metavar="RATE",
        help="shape every rank's link to RATE (e.g. 100mbit, 1gbit): one network namespace per rank",
    )
    cluster = parser.add_argument_group("an emulated cluster (needs root and iproute2)")
    cluster.add_argument("--hosts", type=int, default=None, metavar="H", help="emulated hosts")
    cluster.add_argument("--ranks-per-host", type=int, default=None, metavar="G", help="ranks on each host")
    cluster.add_argument(
        "--inter-host-bandwidth", default=None, metavar="RATE", help="each host's link to the switch"
    )
    cluster.add_argument(
        "--intra-host-bandwidth",
        default=None,
        metavar="RATE",
        help="each host's loopback, which its ranks share (default: unshaped)",
    )
    parser.add_argument(
        "--allow-unshaped",
        action="store_true",
        help="where network emulation is unavailable (not root, no iproute2), run unshaped instead of failing",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="results folder (default: scratch/<pipeline>/<run>, git-ignored; DVC stages pass results/...)",
    )
    parser.add_argument(
        "--stop-at",
        default=None,
        metavar="METRIC=VALUE",
        help="end every run at its first evaluation reaching this target (test_accuracy=0.99: at or "
        "above, test_loss=1.6: at or below); the lr schedule still spans the whole run (time to target)",
    )
    parser.add_argument(
        "--stretch",
        default=None,
        metavar="N",
        help="train every run N times as long, its schedule stretched (epochs, warm-up, milestones, "
        "max_steps): the leaderboard's runs may take up to 2x the recipe's steps",
    )
    parser.add_argument("--run-name", default=None, help="MLflow run name (default: the run)")
    parser.add_argument(
        "--inputs",
        default=None,
        metavar="DIR",
        help="an earlier stage's outputs that the pipeline's own stage reads (sparse AxoNN: the prune "
        "stage's; default results/<pipeline>)",
    )
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seed", type=int, default=None, help="override the run's seed (repeats of one run)")
    seeds.add_argument(
        "--seeds",
        default=None,
        metavar="LIST",
        help="comma-separated seeds trained one after the other by the same ranks (one start-up "
        "for all), each into <out>/<run>/seed<k> with MLflow run name <run>-seed<k>",
    )
    args = parser.parse_args(argv)
    quiet_environment()
    if args.seed is not None:
        os.environ[SEED_ENV] = str(args.seed)
    if args.seeds is not None:
        try:
            os.environ[SEEDS_ENV] = ",".join(str(s) for s in parse_seeds(args.seeds))
        except ValueError as error:
            raise SystemExit(f"error: {error}") from None
    try:
        if args.stop_at is not None:
            parse_stop_at(args.stop_at)  # checked here, once; the ranks read it from the environment
            os.environ[STOP_AT_ENV] = args.stop_at
        if args.stretch is not None:
            os.environ[STRETCH_ENV] = str(parse_stretch(args.stretch))
        if args.run_name and len(parse_runs(args.run)) > 1:
            raise ValueError(
                f"--run-name names one run; {args.run!r} are several (each is named after itself)"
            )
        if args.out:
            os.environ[OUT_DIR_ENV] = os.path.abspath(args.out)
        if args.inputs:
            os.environ[INPUTS_ENV] = os.path.abspath(args.inputs)
        repeats = plan_repeats(args.pipeline, args.run, args.scale)  # every run's parameters checked
        config = repeats[0][1]
        if args.net_bandwidth is not None:
            netem.parse_rate(args.net_bandwidth)
        check_cluster(args, config.world_size)
        # Missing or corrupt data fails here, once, not in every rank; a cold cache is filled now.
        load_dataset(config.dataset, "test", limit=1, seq_len=config.seq_len)
        if not args.out:  # a hand run: never into results/ (DVC stages name their folder)
            print(f"no --out: writing under {repeats[0][2]} (git-ignored scratch)", file=sys.stderr)
        for _, _, directory, _ in repeats:  # a read-only folder fails here, not at the first checkpoint
            for folder in dict.fromkeys((directory, str(artifacts_for(directory)))):
                check_writable(folder, "run folder")
        # Held until this process (torchrun's agent after the checks) exits: a second launch on any of
        # these folders fails here, naming this one's pid.
        lock_run_folders(directory for _, _, directory, _ in repeats)
    except (ValueError, WriteError) as error:  # DataError and RunFolderBusy are ValueErrors
        raise SystemExit(f"error: {error}") from None
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())  # the workers' parent: they die with it
    for key, value in RESTART_SAFE_ENV.items():
        os.environ.setdefault(key, value)
    if args.run_name:
        os.environ[RUN_NAME_ENV] = args.run_name
    # the ranks record their failures here (harness.failures); removed on every exit but SIGKILL
    with tempfile.TemporaryDirectory(prefix="thinwire-failures-") as failures_dir:
        os.environ[failures.FAILURES_ENV] = failures_dir
        # torchrun's own record of the first failure (it copies the rank's): quietly, in there too
        os.environ["TORCHELASTIC_ERROR_FILE"] = os.path.join(failures_dir, "launcher-error.json")
        code = _start(args, config.world_size, config.max_restarts, failures_dir)
    if code:
        raise SystemExit(code)


def _start(args: argparse.Namespace, world_size: int, max_restarts: int, failures_dir: str) -> int:
    """Start the ranks as the flags say; the launch's exit code."""
    if args.hosts is not None:
        try:
            netem.check_support()
        except netem.NetemError as error:
            raise SystemExit(f"error: {error}") from None
        return _reported(run_cluster(args, max_restarts), failures_dir)
    if args.net_bandwidth is not None:
        try:
            netem.check_support()
        except netem.NetemError as error:
            if not args.allow_unshaped:
                raise SystemExit(f"error: {error}") from None
            print(f"warning: {error}\nwarning: running UNSHAPED (--allow-unshaped)", file=sys.stderr)
        else:
            return _reported(run_shaped(args, world_size, max_restarts), failures_dir)
    sys.stdout.flush()
    return run_attempts(
        torchrun_args(args.pipeline, args.run, args.scale, world_size, 0), max_restarts, failures_dir
    )


def _reported(code: int, failures_dir: str) -> int:
    """An emulated network's exit ``code``, with the rank and the cause of its last failure printed
    last, once (its restart loop, :mod:`harness.netem`, stops at an error a restart cannot fix and
    returns :data:`~harness.failures.EXIT_NO_RETRY`)."""
    if not code:
        return code
    records = failures.read_records(failures_dir)
    _, line = failures.verdict(records, {})
    if code == failures.EXIT_NO_RETRY:
        if not any(r.get("cause") for r in records):
            line = (
                f"a rank exited with code {failures.EXIT_NO_RETRY} (an error a restart cannot fix; its "
                "record was lost, its traceback is above)"
            )
        line += ". Not restarted: a restart would fail the same way"
    print(f"error: {line}", file=sys.stderr)
    return code


def run_shaped(args: argparse.Namespace, world_size: int, max_restarts: int) -> int:
    """One namespace per rank behind ``args.net_bandwidth`` links; always torn down."""
    argv = [sys.executable, "-m", "pipelines.train", args.pipeline, args.run]
    argv += ["--scale", args.scale] if args.scale else []
    with netem.terminate_as_exception(), netem.VirtualNetwork(world_size, args.net_bandwidth) as network:
        return netem.run_workers(network, argv, max_restarts=max_restarts)


CLUSTER_FLAGS = ("hosts", "ranks_per_host", "inter_host_bandwidth")


def check_cluster(args: argparse.Namespace, world_size: int) -> None:
    """The cluster flags come together, multiply to the run's world size, and exclude
    ``--net-bandwidth`` (one namespace per rank)."""
    given = [f"--{name.replace('_', '-')}" for name in CLUSTER_FLAGS if getattr(args, name) is not None]
    if not given and args.intra_host_bandwidth is None:
        return
    if len(given) < len(CLUSTER_FLAGS):
        raise ValueError(
            "an emulated cluster needs --hosts, --ranks-per-host and --inter-host-bandwidth together; "
            f"got only {', '.join(given) or '--intra-host-bandwidth'}"
        )
    if args.net_bandwidth is not None:
        raise ValueError("--net-bandwidth (a namespace per rank) and --hosts (per host) exclude each other")
    for flag, value in (("--hosts", args.hosts), ("--ranks-per-host", args.ranks_per_host)):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if args.hosts * args.ranks_per_host != world_size:
        raise ValueError(
            f"--hosts {args.hosts} x --ranks-per-host {args.ranks_per_host} = "
            f"{args.hosts * args.ranks_per_host} ranks, but the run's world_size is {world_size}"
        )
    for rate in (args.inter_host_bandwidth, args.intra_host_bandwidth):
        if rate is not None:
            netem.parse_rate(rate)


def run_cluster(args: argparse.Namespace, max_restarts: int) -> int:
    """H emulated hosts, one torchrun agent each (c10d rendezvous); always torn down."""
    target = ["-m", "pipelines.train", args.pipeline, args.run]
    target += ["--scale", args.scale] if args.scale else []
    network = netem.VirtualNetwork(
        args.hosts, args.inter_host_bandwidth, intra_rate=args.intra_host_bandwidth
    )
    with netem.terminate_as_exception(), network:
        return netem.run_hosts(network, args.ranks_per_host, target, max_restarts=max_restarts)


if __name__ == "__main__":
    main()
