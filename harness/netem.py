"""Real slow links between worker processes: one network namespace per rank, shaped with ``tc``.

Between processes on one machine gloo moves gigabytes per second, which hides exactly what
gradient compression is for. :class:`VirtualNetwork` builds a small switched LAN instead::

    rank 0 ns            switch ns                 rank 1 ns
    [tw0 10.77.0.1] ==== [p0]--(br0)--[p1] ==== [tw0 10.77.0.2]   ...
         tbf rate R        tbf      tbf           tbf rate R

Each rank's namespace holds one end of a veth pair (``tw0``) and its loopback; the other end
(``p<r>``) sits on a bridge in a separate switch namespace, so nothing touches the host's own
interfaces or routes and traffic goes only between these namespaces. Both ends of every link are
shaped with a token-bucket filter (``tbf``) at the configured rate, so each rank has a full-duplex
link of that rate to the switch, like a server's NIC in a cluster. This kernel has no ``netem``
qdisc: there is no added delay or loss; latency is the cost model's business
(:mod:`harness.costmodel`).

gloo is pointed at the veth with ``GLOO_SOCKET_IFNAME=tw0`` and ``MASTER_ADDR`` = rank 0's address
(:meth:`VirtualNetwork.env`). Names carry the creating process id (``tw<pid>n<k>-r<rank>``), so
:meth:`VirtualNetwork.close` removes exactly what this process made (deleting a namespace deletes
its veth ends and qdiscs), and :func:`remove_stale` removes only networks whose creator is dead and in which nothing runs.

Several hosts (:func:`run_hosts`): a namespace is then a *host* running G ranks, which talk to each
other over the namespace's own loopback (optionally shaped to an intra-host rate) and to the other
hosts over the shaped link; on each host one ``torchrun`` agent starts its ranks and finds the
others through torchrun's c10d rendezvous on host 0, exactly as on a cluster (no ``--standalone``)::

    host 0 ns (ranks 0..G-1, lo)  ==== switch ns ====  host 1 ns (ranks G..2G-1, lo)  ...

Needs root and iproute2 (``ip``, ``tc``); :func:`check_support` says what is missing and how to fix it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from trainer.distributed import LAUNCHER_PID_ENV, RESTART_SAFE_ENV, kill_with_parent

from . import failures
from .costmodel import parse_rate as parse_rate  # re-exported for the launcher
from .failures import EXIT_NO_RETRY

log = logging.getLogger(__name__)

SUBNET = "10.77.0"  # private, and only ever configured inside our own namespaces
IFNAME = "tw0"  # the rank's end of its veth, the same name in every rank namespace
MAX_RANKS = 250
_PREFIX = "tw"
_NAME = re.compile(rf"^{_PREFIX}(\d+)n(\d+)-(sw|r\d+)$")
_counter = itertools.count()


class NetemError(RuntimeError):
    """The emulated network could not be built (permissions, missing tools, bad rate)."""


def rate_label(bps: float) -> str:
    """1e8 -> ``"100mbit"``: the short form the launcher takes and run tags carry."""
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g}{unit}"
    return f"{bps:g}bit"


def check_support() -> None:
    """Raise :class:`NetemError` naming what is missing (root, ``ip``, ``tc``) and how to fix it."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces and tc need CAP_NET_ADMIN; run as root)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            missing.append(f"`{tool}` (install iproute2, e.g. `apt-get install iproute2`)")
    if missing:
        raise NetemError(
            "network emulation is not available here: missing "
            + "; ".join(missing)
            + ". Or run without shaping by opting in explicitly (launcher: --allow-unshaped)."
        )


def supported() -> bool:
    try:
        check_support()
    except NetemError:
        return False
    return True


def _run(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise NetemError(f"`{' '.join(argv)}` failed (exit {result.returncode}): {result.stderr.strip()}")


def list_namespaces() -> list[str]:
    """Names of all network namespaces (``ip netns list``), ours or not."""
    result = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return [line.split()[0] for line in result.stdout.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def namespace_pids(name: str) -> list[int]:
    """Processes running inside network namespace ``name`` (``ip netns pids``)."""
    result = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, check=False)
    return [int(pid) for pid in result.stdout.split() if pid.isdigit()]


def remove_stale() -> list[str]:
    """Delete thinwire namespaces whose creating process is gone (a SIGKILLed launcher) and in
    which no process runs.

    Only names of our own pattern whose embedded creator pid no longer runs are candidates; one
    that still holds processes (a dead launcher's orphaned workers, still training) is left alone
    with a warning naming them: deleting it would cut their network mid-collective.
    """
    removed, busy = [], []
    for name in list_namespaces():
        match = _NAME.match(name)
        if match and not _pid_alive(int(match.group(1))):
            pids = namespace_pids(name)
            if pids:
                busy.append(f"{name} (pids {', '.join(map(str, pids))})")
                continue
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
            removed.append(name)
    if removed:
        log.warning("removed %d stale namespace(s) left by dead launchers: %s", len(removed), removed)
    if busy:
        log.warning(
            "left %d namespace(s) of dead launchers in place: processes still run in them: %s",
            len(busy),
            "; ".join(busy),
        )
    return removed


@dataclass(frozen=True)
class LinkShape:
    """A token-bucket shaper: ``rate`` bits/s, ``burst`` bytes, queue ``latency_ms`` at most."""

    rate_bps: float
    burst_bytes: int
    latency_ms: int = 100

    @classmethod
    def for_rate(cls, rate: str | float) -> LinkShape:
        bps = parse_rate(str(rate))
        # The bucket: 1.5 ms of traffic, at least 128 KiB (two 64 KiB GSO super-packets), at most
        # 1 MiB. Smaller buckets hold TCP far below the rate at 300 Mbit/s and 1 Gbit/s; 128 KiB
        # keeps it near the rate (benchmarks/comm/bench_netem_burst.py -> results/netem_burst.md).
        # The price: after an idle gap up to one bucket passes at veth speed, which flatters
        # messages smaller than the bucket by at most burst / rate per gap (10 ms at 100 Mbit/s).
        burst = int(min(max(bps / 8 * 1.5e-3, 128 * 1024), 1 << 20))
        return cls(rate_bps=bps, burst_bytes=burst)

    def tc_args(self) -> list[str]:
        return [
            "tbf",
            "rate",
            f"{int(self.rate_bps)}bit",
            "burst",
            str(self.burst_bytes),
            "latency",
            f"{self.latency_ms}ms",
        ]


class VirtualNetwork:
    """``world_size`` namespaces on one shaped switch; a context manager that always cleans up.

    ``rate=None`` builds the same namespaces without shaping (for comparisons). A namespace is one
    rank (:func:`run_workers`) or one host of several ranks (:func:`run_hosts`); ``intra_rate``
    shapes each namespace's loopback, which a host's ranks share (default: unshaped, as the fast
    links inside a machine).
    """

    def __init__(
        self, world_size: int, rate: str | float | None, *, intra_rate: str | float | None = None
    ) -> None:
        if (
            isinstance(world_size, bool)
            or not isinstance(world_size, int)
            or not 1 <= world_size <= MAX_RANKS
        ):
            raise ValueError(f"world_size must be an integer in 1..{MAX_RANKS}, got {world_size!r}")
        self.world_size = world_size
        self.shape = LinkShape.for_rate(rate) if rate is not None else None
        self.intra_shape = LinkShape.for_rate(intra_rate) if intra_rate is not None else None
        tag = f"{_PREFIX}{os.getpid()}n{next(_counter)}"
        self.switch = f"{tag}-sw"
        self.namespaces = [f"{tag}-r{r}" for r in range(world_size)]
        self._created: list[str] = []
        self.is_up = False

    # -- addresses and commands ------------------------------------------------------------------

    @staticmethod
    def address(rank: int) -> str:
        return f"{SUBNET}.{rank + 1}"

    def env(self, rank: int) -> dict[str, str]:
        """What gloo and torch.distributed need to talk over the shaped links."""
        return {
            "MASTER_ADDR": self.address(0),
            "GLOO_SOCKET_IFNAME": IFNAME,
            "THINWIRE_NETWORK": rate_label(self.shape.rate_bps) if self.shape else "unshaped-netns",
        }

    def command(self, rank: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside rank ``rank``'s namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.namespaces[rank], *argv]

    # -- life cycle ------------------------------------------------------------------------------

    def up(self) -> VirtualNetwork:
        check_support()
        remove_stale()
        try:
            self._add_namespace(self.switch)
            _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.switch, "link", "set", "br0", "up")
            for rank, ns in enumerate(self.namespaces):
                self._add_namespace(ns)
                port = f"p{rank}"
                _run("ip", "link", "add", IFNAME, "netns", ns, "type", "veth", "peer", "name", port,
                     "netns", self.switch)  # fmt: skip
                _run("ip", "-n", ns, "addr", "add", f"{self.address(rank)}/24", "dev", IFNAME)
                _run("ip", "-n", ns, "link", "set", "lo", "up")
                _run("ip", "-n", ns, "link", "set", IFNAME, "up")
                _run("ip", "-n", self.switch, "link", "set", port, "master", "br0")
                _run("ip", "-n", self.switch, "link", "set", port, "up")
                if self.shape is not None:  # both directions: upload at the rank, download at the switch
                    _run("tc", "-n", ns, "qdisc", "add", "dev", IFNAME, "root", *self.shape.tc_args())
                    _run("tc", "-n", self.switch, "qdisc", "add", "dev", port, "root", *self.shape.tc_args())
                if self.intra_shape is not None:  # a host's ranks reach each other over its loopback
                    _run("tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", *self.intra_shape.tc_args())
        except BaseException:
            self.close()
            raise
        self.is_up = True
        log.info(
            "virtual network up: %d ranks, %s per link",
            self.world_size,
            rate_label(self.shape.rate_bps) if self.shape else "unshaped",
        )
        return self

    def _add_namespace(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self._created.append(name)

    def close(self) -> None:
        """Delete every namespace this object created (and with them their links and qdiscs).

        Processes still inside a rank namespace are this network's own workers: they are killed
        first (by the pids ``ip netns pids`` lists for our namespace names), or the namespace
        would linger until they exit.
        """
        for name in reversed(self._created):
            for pid in namespace_pids(name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            result = subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True, check=False)
            if result.returncode != 0 and name in list_namespaces():
                log.error("could not delete namespace %s: %s", name, result.stderr.strip())
        self._created.clear()
        self.is_up = False

    def __enter__(self) -> VirtualNetwork:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self) -> Mapping[str, object]:
        return {
            "world_size": self.world_size,
            "rate_bps": self.shape.rate_bps if self.shape else None,
            "burst_bytes": self.shape.burst_bytes if self.shape else None,
            "intra_rate_bps": self.intra_shape.rate_bps if self.intra_shape else None,
            "namespaces": list(self.namespaces),
        }


# -- workers ---------------------------------------------------------------------------------------


class Terminated(Exception):
    """SIGTERM (or SIGHUP) arrived: unwind and clean up, as for Ctrl-C."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(f"stopped by signal {signum}")


@contextlib.contextmanager
def terminate_as_exception() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into :class:`Terminated` inside the block, so ``finally`` and
    ``with`` clean-ups run (the default action would kill the process on the spot)."""
    import signal

    previous = {sig: signal.signal(sig, _raise_terminated) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop(processes: Sequence[subprocess.Popen[bytes]], grace: float = 10.0) -> None:
    """SIGTERM every worker's process group, then SIGKILL what is left after ``grace`` seconds."""
    import signal
    import time

    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _wait(processes: Sequence[subprocess.Popen[bytes]], poll_seconds: float) -> dict[int, int]:
    """Poll until every process has ended with 0 (returns {}) or one has failed: then the exit codes
    of those that have failed by now, by position (negative: a signal)."""
    import time

    while True:
        codes = [process.poll() for process in processes]
        failed = {i: code for i, code in enumerate(codes) if code is not None and code != 0}
        if failed:
            return failed
        if all(code == 0 for code in codes):
            return {}
        time.sleep(poll_seconds)


def _exit_text(code: int) -> str:
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


def run_workers(
    network: VirtualNetwork,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    max_restarts: int = 0,
    master_port: int = 29500,
    poll_seconds: float = 0.2,
) -> int:
    """Run ``argv`` once per rank, each inside its namespace; return 0 or the failure's code.

    Like torchrun's agent: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT are set; if any
    worker fails, all are stopped and, up to ``max_restarts`` times, all are started again (with
    TORCHELASTIC_RESTART_COUNT set; training resumes from its last checkpoint), unless the failure
    is one a restart cannot fix (:mod:`harness.failures`: a rank exited with
    :data:`~harness.failures.EXIT_NO_RETRY`, or recorded such a cause in ``$THINWIRE_FAILURES_DIR``,
    a temporary folder where the environment names none): then the run ends at once, returning
    ``EXIT_NO_RETRY``. Every worker is stopped on every exit path: failure, Ctrl-C and SIGTERM. The
    network itself is the caller's.
    """
    if not network.is_up:
        raise NetemError("the virtual network is not up: use `with VirtualNetwork(...) as net:`")
    base_env = {**os.environ, **(env or {})}
    with failures.records_folder(base_env) as folder:

        def start(attempt: int) -> list[subprocess.Popen[bytes]]:
            rank_env = {**base_env, failures.FAILURES_ENV: folder}
            port = master_port + attempt  # a fresh port: no TIME_WAIT surprises
            return [
                _start_worker(network, r, argv, rank_env, port, attempt) for r in range(network.world_size)
            ]

        return _restart_loop(
            start, max_restarts, folder, poll_seconds, name=lambda rank: f"rank {rank}", what="worker"
        )


def _restart_loop(
    start: Callable[[int], list[subprocess.Popen[bytes]]],
    max_restarts: int,
    folder: str,
    poll_seconds: float,
    *,
    name: Callable[[int], str],
    what: str,
) -> int:
    """Start every process (``start(attempt)``, attempt 0 first) and wait for them; after a failure
    stop them all and start them again, up to ``max_restarts`` times, unless the failure is one a
    restart cannot fix (a process exited with :data:`EXIT_NO_RETRY`, or a rank recorded such a
    cause in ``folder``): then return ``EXIT_NO_RETRY`` at once. Else 0, or the last failure's
    code (128 + the signal's number for a signal). Every process is stopped on every exit path."""
    processes: list[subprocess.Popen[bytes]] = []
    code = 1
    try:
        for attempt in range(max_restarts + 1):
            failures.clear_records(folder)  # the last attempt's records only
            processes = start(attempt)
            failed = _wait(processes, poll_seconds)
            if not failed:
                return 0
            _stop(processes)
            index, code = next(iter(failed.items()))
            log.error(
                "%s %s (attempt %d of %d)", name(index), _exit_text(code), attempt + 1, max_restarts + 1
            )
            exits = {
                **failed,
                **{i: p.returncode for i, p in enumerate(processes) if p.returncode == EXIT_NO_RETRY},
            }
            retry, _ = failures.verdict(failures.read_records(folder), exits)
            if not retry:  # the cause itself is the caller's to print, last (pipelines.launch)
                log.error("not restarted: a rank failed with an error a restart cannot fix")
                return EXIT_NO_RETRY
            if attempt < max_restarts:
                log.warning("starting every %s again (%d of %d)", what, attempt + 1, max_restarts)
        return code if code > 0 else 128 - code
    finally:
        _stop(processes)


def _start_worker(
    network: VirtualNetwork, rank: int, argv: Sequence[str], env: Mapping[str, str], port: int, attempt: int
) -> subprocess.Popen[bytes]:
    """Rank ``rank`` of attempt ``attempt`` (0 first), in its namespace, as torchrun would start it."""
    rank_env = {
        **env,
        **network.env(rank),
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": str(network.world_size),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(network.world_size),
        "TORCHELASTIC_RESTART_COUNT": str(attempt),
        LAUNCHER_PID_ENV: str(os.getpid()),  # the worker dies with this process
    }
    rank_env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun: N workers share the cores
    # c10d warns on every connection that a namespace has no reverse DNS: harmless
    rank_env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    return subprocess.Popen(network.command(rank, argv), env=rank_env, start_new_session=True)


def agent_command(
    network: VirtualNetwork,
    host: int,
    ranks_per_host: int,
    target: Sequence[str],
    *,
    rdzv_port: int,
    rdzv_id: str,
) -> list[str]:
    """Host ``host``'s torchrun agent, inside its namespace: the per-host command of a cluster
    (c10d rendezvous on host 0's address; ``is_host`` says which agent serves its store, since a
    namespace's address is not the machine's hostname), then ``target`` (a script or ``-m
    module`` and its arguments). The agent's pid is its workers' ``THINWIRE_LAUNCHER_PID``. It
    restarts nothing itself (``--max-restarts=0``): torchrun's restarts cannot tell a failure that
    a restart fixes from one it cannot; :func:`run_hosts` restarts."""
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",  # torchrun, this interpreter's
        f"--nnodes={network.world_size}",
        f"--nproc_per_node={ranks_per_host}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={network.address(0)}:{rdzv_port}",
        f"--rdzv-id={rdzv_id}",
        f"--rdzv-conf=is_host={'true' if host == 0 else 'false'}",
        f"--local-addr={network.address(host)}",
        "--max-restarts=0",
        *target,
    ]
    # `ip netns exec` and the shell exec: the agent keeps the shell's pid ($$)
    shell = f'export {LAUNCHER_PID_ENV}=$$; exec "$@"'
    return network.command(host, ["sh", "-c", shell, "sh", *torchrun])


def cluster_label(network: VirtualNetwork, ranks_per_host: int) -> str:
    """The run's ``network`` tag on emulated hosts: ``hosts2x2-100mbit`` (H x G, the inter-host
    rate), ``-intra10gbit`` when the loopback is shaped too."""
    inter = rate_label(network.shape.rate_bps) if network.shape else "unshaped"
    intra = f"-intra{rate_label(network.intra_shape.rate_bps)}" if network.intra_shape else ""
    return f"hosts{network.world_size}x{ranks_per_host}-{inter}{intra}"


def run_hosts(
    network: VirtualNetwork,
    ranks_per_host: int,
    target: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    max_restarts: int = 0,
    rdzv_port: int = 29400,
    poll_seconds: float = 0.2,
    on_start: Callable[[list[subprocess.Popen[bytes]]], None] | None = None,
) -> int:
    """Run ``target`` on ``network.world_size`` emulated hosts of ``ranks_per_host`` ranks each, one
    torchrun agent per host as on a cluster (:func:`agent_command`); return 0 or the failure's code.

    Restarts as a cluster's scheduler would restart a job: a worker that fails (its agent then
    exits) or an agent that is killed (a lost host) stops every agent, and all are started again in
    a new rendezvous (training resumes from its last checkpoint), up to ``max_restarts`` times,
    unless a rank recorded an error that a restart cannot fix (:mod:`harness.failures`, in
    ``$THINWIRE_FAILURES_DIR``, a temporary folder where the environment names none): then the run
    ends at once, returning :data:`~harness.failures.EXIT_NO_RETRY`. (The agents' own restarts,
    torchrun's ``--max-restarts``, would retry every failure.) Every agent and worker is stopped on
    every exit path (workers die with their agent); the network is the caller's. ``on_start``
    sees the agents' processes of each attempt once all are started (tests kill one).
    """
    import uuid

    if not network.is_up:
        raise NetemError("the virtual network is not up: use `with VirtualNetwork(...) as net:`")
    if isinstance(ranks_per_host, bool) or not isinstance(ranks_per_host, int) or ranks_per_host < 1:
        raise ValueError(f"ranks_per_host must be an int >= 1, got {ranks_per_host!r}")
    rdzv_id = f"thinwire-{uuid.uuid4().hex[:8]}"
    host_env = {
        **os.environ,
        **(env or {}),
        "GLOO_SOCKET_IFNAME": IFNAME,
        "THINWIRE_NETWORK": cluster_label(network, ranks_per_host),
        **RESTART_SAFE_ENV,
    }
    host_env.setdefault("OMP_NUM_THREADS", "1")
    host_env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

    with failures.records_folder(host_env) as folder:
        host_env[failures.FAILURES_ENV] = folder

        def start(attempt: int) -> list[subprocess.Popen[bytes]]:
            agents = []
            for host in range(network.world_size):
                # a new rendezvous on a fresh port each attempt: no TIME_WAIT surprises
                command = agent_command(network, host, ranks_per_host, target, rdzv_port=rdzv_port + attempt,
                                        rdzv_id=f"{rdzv_id}-{attempt}")  # fmt: skip
                agents.append(
                    subprocess.Popen(
                        command, env=host_env, start_new_session=True, preexec_fn=kill_with_parent
                    )
                )
            if on_start is not None:
                on_start(list(agents))
            return agents

        return _restart_loop(
            start,
            max_restarts,
            folder,
            poll_seconds,
            name=lambda host: f"host {host}'s agent",
            what="host's agent",
        )
