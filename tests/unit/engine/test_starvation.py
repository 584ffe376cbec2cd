"""engine/starvation.py: what a starting server's process group got of the CPU, judged on real
processes: a "server" (a process group of its own) pinned to a core at the lowest priority, as a
trial's server runs at Ray's worker priority, beside a busy loop pinned to the same core."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from optimizer.engine import starvation
from optimizer.engine.starvation import CpuShare, CpuWatch, Neighbour, cpu_list, starved_failure
from optimizer.engine.vllm import VllmServer
from tests.unit.engine.processes import kill_tree

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores: one bound, one not")

CORE = max(os.sched_getaffinity(0))
READY = "print('ready', flush=True)\n"
SPIN, SLEEP = READY + "while True: pass", "import time\n" + READY + "time.sleep(600)"


def _start(code: str, core: int | None = None, nice: int = 0, own_group: bool = False, readies: int = 1):
    """A Python process running `code`, niced and pinned to `core` as soon as it exists; returned once
    it (and its children: `readies` in all) said ready, past the interpreter's start-up: what is
    measured is the loop, or the sleep."""
    p = subprocess.Popen([sys.executable, "-c", code], process_group=0 if own_group else None,
                         stdout=subprocess.PIPE, text=True)
    os.setpriority(os.PRIO_PROCESS, p.pid, nice)
    if core is not None:
        os.sched_setaffinity(p.pid, {core})
    for _ in range(readies):
        assert p.stdout.readline() == "ready\n"
    return p


@pytest.fixture
def processes():
    """Start processes (`_start`); each is killed afterwards with its children, or its whole group."""
    started = []
    yield lambda *a, **k: started.append((_start(*a, **k), k.get("own_group", False))) or started[-1][0]
    for p, own_group in started:
        if own_group:
            os.killpg(p.pid, signal.SIGKILL)
        else:
            kill_tree(p.pid)
        p.wait()


def _asleep(process: subprocess.Popen) -> subprocess.Popen:
    """`process` once it sleeps: past "ready", a niced process on a busy core may wait its turn to
    reach its sleep, and that wait is not what the test watches."""
    end = time.monotonic() + 10
    while psutil.Process(process.pid).status() != psutil.STATUS_SLEEPING:
        assert time.monotonic() < end, "the process never went to sleep"
        time.sleep(0.01)
    return process


def _watch(server: subprocess.Popen, seconds: float) -> CpuWatch:
    watch = CpuWatch(server.pid)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        watch.sample()
        time.sleep(0.5)
    return watch


def test_a_server_kept_off_its_core_is_starved_and_the_busy_process_is_named(processes):
    # The server first: a niced interpreter starting on a core already busy takes a minute to say ready.
    server = processes(SPIN, CORE, nice=19, own_group=True)
    busy = processes(SPIN, CORE)
    watch = _watch(server, 1.0)
    assert not watch.judge(min_window_s=2).starved  # too short a window says nothing
    time.sleep(1.5)
    share = watch.judge(min_window_s=2)
    assert share.starved, share.describe()
    assert share.cores == (CORE,) and share.since_bind  # the core it bound itself to
    assert share.used < starvation.STARVED_CORES and share.waited >= starvation.WAITED_SHARE
    assert busy.pid in [n.pid for n in share.others], share.describe()
    assert next(n.label for n in share.others if n.pid == busy.pid).endswith("while True: pass")


def test_a_server_alone_on_its_core_got_it(processes):
    server = processes(SPIN, CORE, own_group=True)
    share = _watch(server, 2.5).judge(min_window_s=2)
    assert not share.starved and share.used > starvation.STARVED_CORES, share.describe()


def test_a_server_that_sleeps_on_a_busy_core_waits_for_nothing_and_is_not_starved(processes):
    # A start-up stuck on a lock or the network uses no CPU either, but it is not waiting for one.
    server = processes(SLEEP, CORE, nice=19, own_group=True)
    processes(SPIN, CORE)
    share = _watch(_asleep(server), 2.5).judge(min_window_s=2)
    assert share.others_busy >= starvation.OTHERS_BUSY and share.used < 0.05
    assert share.waited is not None and share.waited < 0.1
    assert not share.starved


def test_a_server_that_never_binds_itself_is_judged_on_every_core_its_owner_may_use(processes):
    server = processes(SLEEP, own_group=True)
    share = _watch(server, 0.5).judge(min_window_s=0.1)
    assert share.cores == tuple(sorted(os.sched_getaffinity(0))) and not share.since_bind


def test_the_group_counts_every_process_of_the_group_and_only_those(processes):
    # The group: a sleeping leader and its spinning child (a server's work is in its grandchildren);
    # a spinning process outside the group does not count.
    outside = processes(SPIN)
    code = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {SPIN!r}])\n{SLEEP}"
    server = processes(code, own_group=True, readies=2)
    child = psutil.Process(server.pid).children()[0]
    watch = CpuWatch(server.pid)
    watch.sample()
    before = sum(child.cpu_times()[:2])
    time.sleep(2.0)
    share = watch.judge(min_window_s=1)
    spent = sum(child.cpu_times()[:2]) - before
    assert abs(share.used * share.seconds - spent) < 0.15, (share.describe(), spent)  # the child's CPU, no more
    assert outside.pid not in {k[0] for sample in watch.samples for k in sample.members}


def test_a_timed_out_start_up_spent_starved_is_infra_naming_the_busy_process(tmp_path, processes, monkeypatch):
    monkeypatch.setattr(starvation, "MIN_WINDOW_S", 2.5)
    monkeypatch.setattr(starvation, "SAMPLE_S", 0.5)
    busy = processes(SPIN, CORE)
    exe = tmp_path / "starved-python"  # stands for vLLM: binds itself to the busy core and computes, never serving
    exe.write_text(f"#!{sys.executable}\nimport os\nos.nice(19)\nos.sched_setaffinity(0, {{{CORE}}})\n{SPIN}\n")
    exe.chmod(0o755)
    with VllmServer("m", [], tmp_path / "log", python=str(exe), startup_timeout=4) as server:
        assert server.state == "failed"
    f = server.failure
    assert f.kind == "infra" and f.evidence.startswith("start-up starved of CPU:"), f
    assert f"pid {busy.pid} (" in f.evidence and f"core(s) {CORE}" in f.evidence
    assert "VLLM_CPU_OMP_THREADS_BIND" in f.remedy and "ray.resources" in f.remedy and "queued again" in f.remedy
    assert server.cpu.starved and server.cpu.as_dict()["starved"] is True


def test_a_timed_out_start_up_that_got_its_cpu_stays_a_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(starvation, "MIN_WINDOW_S", 1.0)
    exe = tmp_path / "slow-python"
    exe.write_text(f"#!{sys.executable}\nimport time\nprint('still loading', flush=True)\ntime.sleep(600)\n")
    exe.chmod(0o755)
    with VllmServer("m", [], tmp_path / "log", python=str(exe), startup_timeout=2) as server:
        pass
    assert server.failure.kind == "timeout" and server.failure.evidence == "still loading"
    assert not server.cpu.starved


def _share(**kw) -> CpuShare:
    base = dict(seconds=40.0, used=0.02, waited=0.97, cores=(0,), others_busy=0.99,
                others=(Neighbour(4242, "vllm serve /models/prod", 0.98),), since_bind=True)
    return CpuShare(**{**base, **kw})


def test_the_judgement_needs_little_cpu_a_wait_for_one_and_busy_cores():
    assert _share().starved
    assert not _share(used=0.5).starved  # it got its CPU: slow for another reason
    assert not _share(waited=0.1).starved  # it waited for nothing (a lock, the network)
    assert _share(waited=None).starved  # no schedstat on this kernel: the other two decide
    assert not _share(others_busy=0.2).starved  # its cores were idle: nobody took them
    assert not _share(seconds=3.0).starved  # too short to say


def test_the_failure_names_the_process_and_the_cores_to_bind_to_instead():
    f = starved_failure(_share(), owner_cores={0, 1, 2})
    assert f.kind == "infra"
    assert f.evidence.startswith("start-up starved of CPU: core(s) 0 went to other processes (99% of their time: "
                                 "pid 4242 (vllm serve /models/prod) 0.98 core); its processes bound there used "
                                 "0.02 of a core, waiting for a CPU 97% of the time, over 40 s since its worker bound itself there")
    assert 'engine.env VLLM_CPU_OMP_THREADS_BIND: "1-2"' in f.remedy and "ray.resources" in f.remedy
    alone = starved_failure(_share(cores=(0, 1)), owner_cores={0, 1})
    assert "no other core is free here" in alone.remedy and "ray.resources" in alone.remedy


def test_cpu_lists_are_written_as_vllm_reads_them():
    assert cpu_list([6, 0, 1, 2, 3]) == "0-3,6"
    assert cpu_list({5}) == "5" and cpu_list([]) == ""


def test_while_measured_the_trials_own_process_is_not_another_and_a_busy_neighbour_is():
    """A replay: the trial's own process (this one, sending the requests) keeps a core busy beside an
    idle server, or a neighbour does: only the neighbour counts as the others'. Samples as the
    watch takes them, written here: the judgement's arithmetic, not a busy machine's timing."""
    from optimizer.engine.starvation import _Sample

    me, neighbour, server = (os.getpid(), 1.0), (999_999, 1.0), (999_998, 1.0)

    def judged(busy_key):
        watch = CpuWatch(server[0], owner_cores=frozenset({0, 1}))
        watch.samples = [_Sample(0.0, {busy_key: 0.0, server: 0.0}, {server: 0.0}, frozenset(), {0: 0.0, 1: 0.0}),
                         _Sample(3.0, {busy_key: 3.0, server: 0.0}, {server: 0.0}, frozenset(), {0: 3.0, 1: 0.0})]
        watch.sample = lambda: None  # judge() takes a last sample: these are the window
        return watch.judge(min_window_s=1.0)

    assert judged(me).others_busy == 0.0  # its own core of work is the trial's, not another's
    assert judged(neighbour).others_busy == pytest.approx(0.5)  # one core of two, another process's


def test_once_bound_only_the_processes_bound_to_the_busy_core_are_judged():
    """vLLM's worker binds itself to a core; its API server and engine front stay free to run on
    the other core. Starved on its own core (0.02 of it, waiting for it 90% of the time) while
    those two use 0.3 of the other: the group's 0.32 of a core is not what the worker got. Samples
    as the watch takes them, written here: the judgement's arithmetic."""
    from optimizer.engine.starvation import _Sample

    worker, front, busy = (999_001, 1.0), (999_002, 1.0), (999_003, 1.0)
    watch = CpuWatch(999_002, owner_cores=frozenset({0, 1}))

    def sample(at, bound=True):
        return _Sample(at, {worker: 0.02 * at, front: 0.3 * at, busy: 0.98 * at},
                       {worker: 0.9 * at, front: 0.01 * at}, frozenset({1}) if bound else frozenset(),
                       {0: 0.3 * at, 1: at}, frozenset({worker}) if bound else frozenset())

    watch.samples = [sample(float(t)) for t in range(0, 42, 2)]
    watch.sample = lambda: None  # judge() takes a last sample: these are the window
    share = watch.judge()
    assert share.since_bind and share.cores == (1,)
    assert share.used == pytest.approx(0.02) and share.waited == pytest.approx(0.9)
    assert share.others_busy == pytest.approx(0.68)  # the whole group's CPU is taken off the core's: a lower bound
    assert share.starved, share.describe()
    watch.samples = [sample(float(t), bound=False) for t in range(0, 42, 2)]  # never bound: the whole group
    unbound = watch.judge()
    assert not unbound.since_bind and unbound.used == pytest.approx(0.32) and not unbound.starved


def test_a_process_pinned_to_the_workers_core_counts_whole_though_the_api_server_is_busy_elsewhere(processes):
    """The worker got 0.02 of its core, a process pinned there 0.98, and the server's unbound API
    server 0.6 of the other core: taking the whole group's CPU off the core's busy time leaves the
    others 0.38 of it, yet the pinned process alone took 0.98. Samples as the watch takes them,
    written here, for a real process pinned to the worker's core (its affinity is what is read)."""
    from optimizer.engine.starvation import _Sample

    hog = processes(SLEEP, CORE)
    other = min(os.sched_getaffinity(0))
    worker, front, busy = (999_001, 1.0), (999_002, 1.0), (hog.pid, psutil.Process(hog.pid).create_time())
    watch = CpuWatch(999_002, owner_cores=frozenset({other, CORE}))

    def sample(at):
        return _Sample(at, {worker: 0.02 * at, front: 0.6 * at, busy: 0.98 * at},
                       {worker: 0.9 * at, front: 0.01 * at}, frozenset({CORE}),
                       {other: 0.6 * at, CORE: at}, frozenset({worker}))

    watch.samples = [sample(float(t)) for t in range(0, 42, 2)]
    watch.sample = lambda: None  # judge() takes a last sample: these are the window
    share = watch.judge()
    assert [n.pid for n in share.others] == [hog.pid] and share.others[0].pinned
    assert share.others_busy == pytest.approx(0.98) and share.starved, share.describe()


def test_a_rank_kept_off_its_core_starves_the_server_though_the_other_ranks_run_on_their_own():
    """Three data-parallel ranks, each bound to a core of its own: rank A gets all of core 0, rank B
    0.02 of core 1 and rank C 0.1 of core 2 (each waiting for its core 90% of the time) while a
    process free to run anywhere keeps cores 1 and 2 busy. Summed, the ranks used 1.12 of a core:
    judged together, nothing looks starved. Judged rank by rank, B and C are, and the server with
    the worse of them, B; the other ranks' CPU is not taken off core 1's busy time (they cannot
    have run there), and the remedy offers only a core none of the ranks holds. Samples as the watch
    takes them, written here."""
    from optimizer.engine.starvation import _Sample

    a, b, c, front, busy = ((999_001 + i, 1.0) for i in range(5))
    watch = CpuWatch(999_004, owner_cores=frozenset({0, 1, 2, 3}))

    def sample(at, b_share=0.02, b_waits=0.9):
        return _Sample(at, {a: at, b: b_share * at, c: 0.1 * at, front: 0.3 * at, busy: (1.9 - b_share) * at},
                       {a: 0.01 * at, b: b_waits * at, c: 0.9 * at, front: 0.01 * at}, frozenset({0, 1, 2}),
                       {0: at, 1: at, 2: at, 3: 0.3 * at}, frozenset({a, b, c}),
                       {a: frozenset({0}), b: frozenset({1}), c: frozenset({2})})

    watch.samples = [sample(float(t)) for t in range(0, 42, 2)]
    watch.sample = lambda: None  # judge() takes a last sample: these are the window
    together = watch._share(watch.samples, (0, 1, 2), {a, b, c}, True, starvation.MIN_WINDOW_S)
    assert together.used == pytest.approx(1.12) and not together.starved  # what judging the group alone said
    share = watch.judge()
    assert share.since_bind and share.cores == (1,) and share.server_cores == (0, 1, 2), share.describe()
    assert share.used == pytest.approx(0.02) and share.waited == pytest.approx(0.9)
    assert share.others_busy == pytest.approx(0.68)  # core 1's time less B's and the unbound front's
    assert share.starved, share.describe()
    assert 'VLLM_CPU_OMP_THREADS_BIND: "3"' in starved_failure(share, owner_cores={0, 1, 2, 3}).remedy

    watch.samples = [sample(float(t), b_share=0.9, b_waits=0.05) for t in range(0, 42, 2)]  # B ran: C is the one
    assert watch.judge().cores == (2,)


def test_a_rank_bound_late_counts_as_the_others_cores_until_it_bound():
    """Rank A binds to core 0 only at the third sample; before that it could run on core 1 too, so
    the CPU it used then is taken off core 1's busy time (not counted as another's); after it, it
    is not. Samples as the watch takes them, written here: the arithmetic alone."""
    from optimizer.engine.starvation import _group_cpu_there, _Sample

    a, b = (999_001, 1.0), (999_002, 1.0)

    def sample(at, a_bound):
        cores = {b: frozenset({1}), **({a: frozenset({0})} if a_bound else {})}
        return _Sample(at, {a: at, b: 0.1 * at}, {a: 0.0, b: 0.0}, frozenset({0, 1}), {0: at, 1: at},
                       frozenset(cores), cores)

    window = [sample(0.0, False), sample(2.0, False), sample(4.0, True), sample(6.0, True)]
    assert _group_cpu_there(window, {1}) == pytest.approx(0.6 + 4.0)  # B all along, A's first 4 s
    assert _group_cpu_there(window, {0}) == pytest.approx(6.0)  # A all along; B was bound to core 1 throughout
