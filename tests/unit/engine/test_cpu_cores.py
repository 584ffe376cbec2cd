"""engine/cpu_cores.py: which cores a trial's server binds to, clear of the other vLLM servers on the
machine. Other servers are real processes whose command reads as vLLM's, pinned with
os.sched_setaffinity; the machine's topology is read from a sysfs-shaped directory where a test
needs another shape than this machine's."""

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from optimizer.engine.cpu_cores import (
    Bound,
    bind_free_cores,
    choose,
    is_vllm,
    parse_cpu_list,
    rank_cores,
    rank_count,
    vllm_bindings,
)
from optimizer.engine.starvation import cpu_list
from optimizer.engine.vllm import VllmServer
from tests.unit.engine.processes import kill_tree

VAR = "VLLM_CPU_OMP_THREADS_BIND"
MINE = set(os.sched_getaffinity(0))
two_cores = pytest.mark.skipif(len(MINE) < 2, reason="needs 2 cores: one taken, one free")
SLEEP = "import time; time.sleep(600)"


@pytest.fixture
def spawn():
    """Start a process (argv after `python -c CODE`), optionally pinned; killed afterwards."""
    started = []

    def start(code: str, *argv: str, cores=None, env=None) -> psutil.Process:
        p = subprocess.Popen([sys.executable, "-c", code, *argv], env={**os.environ, **(env or {})})
        started.append(p)
        if cores is not None:
            os.sched_setaffinity(p.pid, cores)
        return psutil.Process(p.pid)

    yield start
    for p in started:
        kill_tree(p.pid)
        p.wait()


def _topology(root: Path, siblings: list[str], nodes: list[int]) -> Path:
    for cpu, (sib, node) in enumerate(zip(siblings, nodes)):
        (root / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (root / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(sib + "\n")
        (root / f"cpu{cpu}" / f"node{node}").mkdir()
    return root


def test_cpu_lists_parse_as_vllm_writes_them():
    assert parse_cpu_list("0-3,6") == {0, 1, 2, 3, 6}
    assert parse_cpu_list("0-1|2-3") == {0, 1, 2, 3}  # one list per rank
    assert parse_cpu_list("auto") == parse_cpu_list("nobind") == parse_cpu_list("") == set()


def test_the_free_cores_are_chosen_as_vllms_auto_binding_would_choose_among_them(tmp_path):
    flat = _topology(tmp_path / "flat", ["0", "1", "2", "3"], [0, 0, 0, 0])
    assert choose({0, 1, 2, 3}, {0}, flat) == [1, 2]  # the last free one kept for vLLM's other processes
    assert choose({0, 1}, {0}, flat) == [1]  # one left: that one
    assert choose({0, 1}, {0, 1}, flat) == []
    smt = _topology(tmp_path / "smt", ["0,4", "1,5", "2,6", "3,7"] * 2, [0] * 8)
    assert choose(set(range(8)), {0}, smt) == [5, 6]  # core 0's sibling 4 is taken with it; one CPU per core
    numa = _topology(tmp_path / "numa", [str(c) for c in range(8)], [0, 0, 0, 0, 1, 1, 1, 1])
    assert choose(set(range(8)), {0, 1, 2}, numa) == [4, 5, 6]  # the node with the most free cores
    assert choose({0, 1, 2}, {0}, tmp_path / "none") == [1]  # no topology to read: each CPU a core


def test_the_workers_are_counted_from_the_flags():
    assert rank_count(["--tensor-parallel-size", "2"]) == 2 and rank_count(["-pp=2"]) == 2
    assert rank_count(["--tensor-parallel-size", "2", "--data-parallel-size", "2", "-pp", "2"]) == 8
    assert rank_count(["--tensor-parallel-size", "1", "--max-num-seqs", "2"]) == 1


def test_each_worker_gets_cores_of_its_own_and_a_spare_core_is_left_to_the_api_server():
    assert rank_cores([0, 1], 2) == "0|1"  # as many cores as workers: the API server shares them
    assert rank_cores([3, 0, 1, 2, 4], 2) == "0-1|2-3"  # core 4 left for the API server
    assert rank_cores([0, 1, 2], 2) == "0|1"
    assert rank_cores([0], 2) == ""  # fewer cores than workers


def test_vllm_processes_are_known_by_their_command_or_an_ancestors(spawn):
    server = spawn(f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {SLEEP!r}])\n{SLEEP}",
                   "vllm", "serve", "/models/prod")
    deadline = time.monotonic() + 10
    while not server.children() and time.monotonic() < deadline:
        time.sleep(0.05)
    worker = server.children()[0]  # a plain `python -c` as vLLM's spawned workers are
    assert is_vllm(server) and is_vllm(worker)
    assert not is_vllm(spawn(SLEEP, "--config", "/srv/vllm-optimizer/study.yaml"))  # a path with vllm in it


@two_cores
def test_vllm_processes_bound_to_some_cores_take_those_cores(spawn):
    first, second = sorted(MINE)[:2]
    pinned = spawn(SLEEP, "vllm", "serve", cores={first})
    declared = spawn(SLEEP, "vllm", "serve", env={VAR: str(second)})  # still starting: not bound yet, but says where
    unbound = spawn(SLEEP, "vllm", "serve")
    other = spawn(SLEEP, cores={first})  # pinned, but not vLLM
    got = {b.pid: b.cores for b in vllm_bindings([pinned, declared, unbound, other])}
    assert got == {pinned.pid: {first}, declared.pid: {second}}
    everywhere = vllm_bindings([pinned], mine={first})  # this process may only use that core: it is not "some"
    assert everywhere == []


@two_cores
def test_the_trial_server_is_bound_clear_of_another_vllm_server(tmp_path, spawn):
    prod = spawn(SLEEP, "vllm", "serve", "/models/prod", cores={min(MINE)})
    server = VllmServer("m", [], tmp_path / "log")
    note = bind_free_cores(server)  # the whole machine is looked at: other vLLM servers may be here too
    assert f"pid {prod.pid} (python -c" in note and note in server.notes
    if VAR in server.env:
        assert min(MINE) not in parse_cpu_list(server.env[VAR]) and "clear of other vLLM processes" in note
    else:
        assert "no core free" in note


@two_cores
def test_the_choice_is_written_in_the_server_log(tmp_path):
    last = max(MINE)
    prod = Bound(4242, "vllm serve /models/prod", frozenset(MINE - {last}))
    server = VllmServer("m", [], tmp_path / "log")
    bind_free_cores(server, [prod])
    assert server.env[VAR] == str(last)
    assert server.notes == [f"CPU cores: worker bound to {last} ({VAR}), clear of other vLLM processes: "
                            f"pid 4242 (vllm serve /models/prod) on {cpu_list(prod.cores)}"]


def test_a_binding_given_by_the_operator_is_kept_and_a_shared_core_said(tmp_path):
    core = min(MINE)
    server = VllmServer("m", [], tmp_path / "log", env={VAR: str(core)})
    note = bind_free_cores(server, [Bound(4242, "vllm serve /models/prod", frozenset({core}))])
    assert server.env[VAR] == str(core)
    assert "given" in note and "kept" in note and f"bound to core(s) {core} too" in note and "pid 4242" in note


def test_vllms_own_binding_is_kept_when_nothing_else_is_bound_or_no_core_is_free(tmp_path):
    alone = VllmServer("m", [], tmp_path / "a")
    assert "vLLM's own binding" in bind_free_cores(alone, []) and VAR not in alone.env
    crowded = VllmServer("m", [], tmp_path / "b")
    note = bind_free_cores(crowded, [Bound(4242, "vllm serve /models/prod", frozenset(MINE))])
    assert VAR not in crowded.env and "no core free" in note and "pid 4242" in note
    ranks = VllmServer("m", ["--tensor-parallel-size", "2"], tmp_path / "c")
    bind_free_cores(ranks, [Bound(4242, "vllm serve", frozenset(MINE - {max(MINE)}))])  # one core free
    assert VAR not in ranks.env and "2 workers but only 1 free core(s)" in ranks.notes[0]


@two_cores
def test_several_workers_are_bound_one_core_list_each(tmp_path):
    server = VllmServer("m", ["--data-parallel-size", "2"], tmp_path / "log")
    note = bind_free_cores(server, [])
    assert server.env[VAR] == rank_cores(MINE, 2) and server.env[VAR].count("|") == 1
    assert note == f"CPU cores: 2 workers bound to {server.env[VAR]} ({VAR}), one list each"
