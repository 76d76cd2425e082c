"""Emulated slow links: namespaces, tc shaping, clean-up on every exit path, clear errors."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness import failures, netem
from trainer.paths import REPO_ROOT

needs_netem = pytest.mark.skipif(
    not netem.supported(), reason="needs root and iproute2 (ip, tc) for network namespaces"
)


def _ours(network: netem.VirtualNetwork) -> set[str]:
    return set([*network.namespaces, network.switch]) & set(netem.list_namespaces())


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"world_size must be an integer in 1\.\.250, got 0"):
        netem.VirtualNetwork(0, "100mbit")
    with pytest.raises(ValueError, match="cannot read 'fast' as a positive link rate; valid examples"):
        netem.VirtualNetwork(2, "fast")
    shape = netem.LinkShape.for_rate("100mbit")
    assert shape.rate_bps == 1e8
    assert shape.burst_bytes == 128 * 1024  # two GSO super-packets: TCP keeps the rate (measured)
    assert netem.LinkShape.for_rate("1gbit").burst_bytes == 187_500
    assert netem.LinkShape.for_rate("100gbit").burst_bytes == 1 << 20
    assert netem.rate_label(1e8) == "100mbit" and netem.rate_label(2.5e9) == "2.5gbit"


def test_missing_root_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(netem.NetemError, match=r"missing root.*--allow-unshaped"):
        netem.check_support()
    monkeypatch.setattr(netem.shutil, "which", lambda tool: None)
    with pytest.raises(netem.NetemError, match=r"`tc` \(install iproute2"):
        netem.check_support()


def test_launcher_rejects_a_bad_rate_before_starting_anything():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.launch",
            "baseline",
            "fp32",
            "--scale",
            "smoke",
            "--net-bandwidth",
            "fast",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "cannot read 'fast' as a positive link rate" in result.stderr


@needs_netem
def test_namespaces_and_qdiscs_exist_while_up_and_are_gone_after_a_failed_run(tmp_path: Path):
    network = netem.VirtualNetwork(2, "100mbit")
    with network:
        assert _ours(network) == set([*network.namespaces, network.switch])
        qdisc = subprocess.run(
            ["tc", "-n", network.namespaces[0], "qdisc", "show", "dev", netem.IFNAME],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "tbf" in qdisc and "100Mbit" in qdisc
        # rank 1 fails mid-way while rank 0 is still busy: all are stopped and started again once
        # (max_restarts 1), then the code comes back
        starts = tmp_path / "starts"
        code = netem.run_workers(
            network,
            ["sh", "-c", f'echo "$RANK" >> {starts}; if [ "$RANK" = 1 ]; then exit 3; fi; sleep 30'],
            max_restarts=1,
        )
        assert code == 3
        assert sorted(starts.read_text().split()) == ["0", "0", "1", "1"]
    assert _ours(network) == set()


@needs_netem
def test_a_failure_a_restart_cannot_fix_is_not_restarted(tmp_path: Path, caplog):
    """Rank 1 fails with an error a restart cannot fix (a NaN: it records the cause and exits
    with EXIT_NO_RETRY, as a training rank does): with 2 restarts left, nothing is started again."""
    starts = tmp_path / "starts"
    worker = tmp_path / "nan.py"
    worker.write_text(
        textwrap.dedent(
            f"""
            import os, time
            from harness.failures import recorded
            rank = int(os.environ["RANK"])
            open({str(starts)!r}, "a").write(f"{{rank}} ")
            with recorded(rank):
                if rank == 1:
                    # fail only once rank 0 has started (under load rank 0's start can come after
                    # rank 1's failure stopped the group, and then it never writes its start)
                    deadline = time.monotonic() + 60
                    while "0" not in open({str(starts)!r}).read().split():
                        assert time.monotonic() < deadline, "rank 0 never started"
                        time.sleep(0.05)
                    raise FloatingPointError("final test_loss is inf at step 8")
                time.sleep(60)
            """
        )
    )
    env = {"PYTHONPATH": str(REPO_ROOT), failures.FAILURES_ENV: str(tmp_path)}
    with netem.VirtualNetwork(2, "1gbit") as network, caplog.at_level(logging.WARNING):
        code = netem.run_workers(network, [sys.executable, str(worker)], env=env, max_restarts=2)
    assert code == failures.EXIT_NO_RETRY
    assert sorted(starts.read_text().split()) == ["0", "1"]  # one attempt
    (record,) = failures.read_records(tmp_path)  # the cause, for the launcher to print last
    assert record["rank"] == 1 and record["cause"] == "non-finite values (NaN or inf)"
    assert [r.getMessage() for r in caplog.records] == [
        f"rank 1 exited with code {failures.EXIT_NO_RETRY} (attempt 1 of 3)",
        "not restarted: a rank failed with an error a restart cannot fix",
    ]


@needs_netem
def test_an_exception_inside_the_block_still_removes_everything():
    network = netem.VirtualNetwork(3, "1gbit")
    with pytest.raises(RuntimeError, match="boom"), network:
        assert len(_ours(network)) == 4
        raise RuntimeError("boom")
    assert _ours(network) == set()


@needs_netem
def test_sigterm_to_the_launcher_stops_workers_and_removes_namespaces(tmp_path: Path):
    script = tmp_path / "hold.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, sys
            sys.path.insert(0, {str(REPO_ROOT)!r})
            from harness import failures, netem
            with netem.terminate_as_exception():
                net = netem.VirtualNetwork(2, "100mbit")
                with net:
                    print(json.dumps(net.namespaces + [net.switch]), flush=True)
                    netem.run_workers(net, ["sh", "-c", "echo $$ >> {tmp_path}/pids; sleep 60"])
            """
        )
    )
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        names = json.loads(process.stdout.readline())
        deadline = time.monotonic() + 30
        while (
            time.monotonic() < deadline
            and len((tmp_path / "pids").read_text().split() if (tmp_path / "pids").exists() else []) < 2
        ):
            time.sleep(0.1)
        pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert set(names) & set(netem.list_namespaces()) == set()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@needs_netem
def test_stale_namespaces_of_dead_launchers_are_removed_and_others_kept():
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"tw{dead.pid}n0-r0"
    foreign = f"notours{os.getpid()}"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    subprocess.run(["ip", "netns", "add", foreign], check=True)
    try:
        assert stale in netem.remove_stale()
        assert stale not in netem.list_namespaces()
        assert foreign in netem.list_namespaces()
    finally:
        for name in (stale, foreign):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


@needs_netem
def test_a_dead_launchers_namespace_with_a_process_inside_is_kept():
    """Orphaned workers of a SIGKILLed launcher keep their network: clean-up skips a namespace
    in which anything runs, and removes it once nothing does."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    busy = f"tw{dead.pid}n1-r0"
    subprocess.run(["ip", "netns", "add", busy], check=True)
    orphan = subprocess.Popen(["ip", "netns", "exec", busy, "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while orphan.pid not in netem.namespace_pids(busy) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert netem.namespace_pids(busy) == [orphan.pid]
        assert busy not in netem.remove_stale()
        assert busy in netem.list_namespaces()
        orphan.kill()
        orphan.wait()
        assert busy in netem.remove_stale()
        assert busy not in netem.list_namespaces()
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()
        subprocess.run(["ip", "netns", "del", busy], capture_output=True, check=False)


def _allreduce_seconds(rate: str | None, tmp_path: Path) -> float:
    out = tmp_path / f"allreduce-{rate}.json"
    argv = [
        sys.executable,
        "-m",
        "pipelines.netbench",
        "--op",
        "all_reduce",
        "--mbytes",
        "10",
        "--repeats",
        "2",
    ]
    with netem.VirtualNetwork(2, rate) as network:
        code = netem.run_workers(network, [*argv, "--out", str(out)], env={"PYTHONPATH": str(REPO_ROOT)})
    assert code == 0
    (result,) = json.loads(out.read_text())["results"]
    assert result["bytes"] == 10_000_000
    assert result["ops"] == {"all_reduce": [1.0, 10_000_000.0]}
    return min(result["seconds"])


@needs_netem
def test_shaped_allreduce_is_slower_than_unshaped_by_about_the_rate(tmp_path: Path):
    unshaped = _allreduce_seconds(None, tmp_path)
    shaped = _allreduce_seconds("100mbit", tmp_path)
    # ring all-reduce, 2 ranks: each sends 2 (p-1)/p * 10 MB = 10 MB = 80 Mbit -> 0.8 s at 100 Mbit/s
    expected = 0.8
    assert 0.6 * expected < shaped < 2.5 * expected, (shaped, unshaped)
    assert unshaped < 0.4 * expected, (shaped, unshaped)
