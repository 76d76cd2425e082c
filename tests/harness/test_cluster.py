"""An emulated cluster: H hosts x G ranks, one torchrun agent per host, real c10d rendezvous.

Each host is a network namespace behind a shaped link; its ranks share its loopback. The run is
``tests/helpers/train_once.py`` (a small MLP, shared-index random-k with error feedback, so that a
resume must restore the generators and residuals exactly), on 4 ranks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from harness import failures, netem
from tests.helpers.mlflow_store import fresh_store
from trainer.paths import REPO_ROOT

needs_netem = pytest.mark.skipif(
    not netem.supported(), reason="needs root and iproute2 (ip, tc) for network namespaces"
)
SCRIPT = str(REPO_ROOT / "tests" / "helpers" / "train_once.py")


def _env(tmp_path: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(REPO_ROOT), "MLFLOW_TRACKING_URI": fresh_store(tmp_path)}


def _ours(network: netem.VirtualNetwork) -> set[str]:
    return set([*network.namespaces, network.switch]) & set(netem.list_namespaces())


@needs_netem
def test_two_hosts_of_two_ranks_train_as_four_ranks_on_one_host_even_after_losing_a_host(tmp_path):
    """The same parameters, bit for bit, from ``torchrun --standalone --nproc_per_node 4`` and from
    2 emulated hosts x 2 ranks (c10d rendezvous, 100 Mbit/s between hosts, the loopback shaped to
    10 Gbit/s) whose host 1 is lost at step 10 (its agent and both its ranks SIGKILLed): every
    host's agent is started again in a new rendezvous, and the run resumes from the step-8
    checkpoint. The namespaces and qdiscs are gone afterwards."""
    env = _env(tmp_path)
    one_host = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", SCRIPT,
         str(tmp_path / "one_host"), "--world-size", "4"],
        env={**os.environ, **env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert one_host.returncode == 0, one_host.stderr[-3000:]
    network = netem.VirtualNetwork(2, "100mbit", intra_rate="10gbit")
    with network:
        qdiscs = subprocess.run(
            ["tc", "-n", network.namespaces[1], "qdisc", "show", "dev", "lo"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert "tbf" in qdiscs and "10Gbit" in qdiscs
        agents: list[list[int]] = []
        code = netem.run_hosts(
            network,
            2,
            [SCRIPT, str(tmp_path / "hosts"), "--world-size", "4", "--kill-host-at", "10"],
            env=env,
            max_restarts=1,
            on_start=lambda started: agents.append([agent.pid for agent in started]),
        )
        assert code == 0
    assert _ours(network) == set()
    assert (tmp_path / "hosts" / "host-killed-once").exists()
    run = json.loads((tmp_path / "hosts" / "run.json").read_text())
    assert run["resumed_at"] == [8] and run["network"] == "hosts2x2-100mbit-intra10gbit"
    expected = torch.load(tmp_path / "one_host" / "model.pt")
    got = torch.load(tmp_path / "hosts" / "model.pt")
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name
    for pid in agents[0]:  # every agent ended with the run
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def _failing_worker(tmp_path: Path, error: str) -> Path:
    """A worker that appends its rank to ``starts`` and, on rank 3, raises ``error`` as a training
    rank does (:func:`harness.failures.recorded`: a record, then exit code 79 or the error); the
    other ranks wait."""
    script = tmp_path / "fail.py"
    script.write_text(
        "import os, time\n"
        "from harness.failures import recorded\n"
        "rank = int(os.environ['RANK'])\n"
        f"open({str(tmp_path / 'starts')!r}, 'a').write(f'{{rank}} ')\n"
        "with recorded(rank):\n"
        f"    if rank == 3:\n        raise {error}\n"
        "    time.sleep(60)\n"
    )
    return script


@needs_netem
def test_a_worker_that_fails_on_every_attempt_stops_the_run_and_every_host(tmp_path):
    """A failure a restart may fix (a lost connection), on every attempt: every agent is started
    again once (max_restarts 1), then the run ends with the failure's code and nothing of the
    cluster is left."""
    script = _failing_worker(tmp_path, "RuntimeError('Connection reset by peer')")
    network = netem.VirtualNetwork(2, "1gbit")
    with network:
        code = netem.run_hosts(network, 2, [str(script)], env=_env(tmp_path), max_restarts=1)
        pids = [pid for ns in network.namespaces for pid in netem.namespace_pids(ns)]
    assert code != 0 and pids == []
    assert sorted((tmp_path / "starts").read_text().split()) == ["0", "0", "1", "1", "2", "2", "3", "3"]
    assert _ours(network) == set()


@needs_netem
def test_a_failure_a_restart_cannot_fix_stops_every_host_at_once(tmp_path):
    """Rank 3 fails with a NaN (its agent exits 1; the rank's record says why): with 2 restarts
    left no agent is started again, the run returns EXIT_NO_RETRY and nothing is left."""
    script = _failing_worker(tmp_path, "FloatingPointError('training loss became nan at step 6: lower lr')")
    network = netem.VirtualNetwork(2, "1gbit")
    with network:
        code = netem.run_hosts(network, 2, [str(script)], env=_env(tmp_path), max_restarts=2)
        pids = [pid for ns in network.namespaces for pid in netem.namespace_pids(ns)]
    assert code == failures.EXIT_NO_RETRY and pids == []
    assert sorted((tmp_path / "starts").read_text().split()) == ["0", "1", "2", "3"]  # one attempt
    assert _ours(network) == set()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--hosts", "2", "--ranks-per-host", "3", "--inter-host-bandwidth", "1gbit"],
         "--hosts 2 x --ranks-per-host 3 = 6 ranks, but the run's world_size is 4"),
        (["--hosts", "2", "--inter-host-bandwidth", "1gbit"],
         "needs --hosts, --ranks-per-host and --inter-host-bandwidth together; got only --hosts, --inter-host-bandwidth"),
        (["--intra-host-bandwidth", "1gbit"],
         "needs --hosts, --ranks-per-host and --inter-host-bandwidth together; got only --intra-host-bandwidth"),
        (["--hosts", "0", "--ranks-per-host", "4", "--inter-host-bandwidth", "1gbit"], "--hosts must be >= 1, got 0"),
        (["--hosts", "2", "--ranks-per-host", "2", "--inter-host-bandwidth", "fast"],
         "cannot read 'fast' as a positive link rate"),
        (["--hosts", "2", "--ranks-per-host", "2", "--inter-host-bandwidth", "1gbit", "--net-bandwidth", "1gbit"],
         "--net-bandwidth (a namespace per rank) and --hosts (per host) exclude each other"),
    ],
)  # fmt: skip
def test_cluster_flags_are_checked_before_anything_starts(tmp_path, monkeypatch, flags, message):
    from pipelines import launch

    monkeypatch.setattr(os, "environ", dict(os.environ))  # main() exports settings for its workers
    pipeline = tmp_path / "own"
    pipeline.mkdir()
    (pipeline / "params.yaml").write_text(
        "scale: t\nscales: {t: {}}\ndefaults: {dataset: mnist, model: mlp, world_size: 4, train_limit: 64}\n"
        "runs: {r: {}}\n"
    )
    with pytest.raises(SystemExit) as stopped:
        launch.main([str(pipeline), "r", "--out", str(tmp_path / "o"), *flags])
    assert message in str(stopped.value)
    assert not (tmp_path / "o").exists()


@needs_netem
def test_sigterm_to_a_cluster_launch_stops_every_agent_and_rank_and_removes_the_hosts(tmp_path):
    """SIGTERM (what DVC or a scheduler sends) to a process running 2 emulated hosts: every agent
    and every rank is gone, and so are the namespaces."""
    worker = tmp_path / "hold.py"
    worker.write_text(
        f"import os, time\nopen({str(tmp_path / 'pids')!r}, 'a').write(f'{{os.getpid()}}\\n')\ntime.sleep(120)\n"
    )
    script = tmp_path / "cluster.py"
    script.write_text(
        "import json, sys\n"
        f"sys.path.insert(0, {str(REPO_ROOT)!r})\n"
        "from harness import netem\n"
        "with netem.terminate_as_exception():\n"
        "    net = netem.VirtualNetwork(2, '1gbit')\n"
        "    with net:\n"
        "        print(json.dumps(net.namespaces + [net.switch]), flush=True)\n"
        f"        netem.run_hosts(net, 2, [{str(worker)!r}])\n"
    )
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        assert process.stdout is not None
        names = json.loads(process.stdout.readline())
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(pids) < 4:
            time.sleep(0.2)
            pids = (
                [int(p) for p in (tmp_path / "pids").read_text().split()]
                if (tmp_path / "pids").exists()
                else []
            )
        assert len(pids) == 4, pids
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert set(names) & set(netem.list_namespaces()) == set()
    time.sleep(1)
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2], (
            pid
        )
