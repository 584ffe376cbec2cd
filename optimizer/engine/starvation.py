"""Whether a vLLM server got the CPU it was given while it started, or while it was measured (`CpuWatch`).

A server that cannot get a core stalls like one that hangs: its log just stops. vLLM on CPU binds
its worker to cores (VLLM_CPU_OMP_THREADS_BIND; "auto" takes the first cores), and a trial's
server runs at Ray's worker priority (nice 15): on a core that another process keeps busy at
normal priority it gets a few percent of it (measured: 0.02 of a core over 40 s, waiting for a
CPU 97% of the time), and its start-up times out through no fault of its flags.

`CpuWatch` samples, every SAMPLE_S while the server starts, the CPU time of every process
(psutil), the run-queue wait of the server's processes (/proc/<pid>/schedstat, the main thread)
and each core's busy time (/proc/stat). `judge()` reads the window since the server bound itself
to cores (the first sample where one of its processes may run on fewer cores than its owner) or,
when it never did or that window is shorter than MIN_WINDOW_S, the whole start-up. The server's
cores are the ones it bound itself to, else every core its owner may use. Its processes judged are
the ones bound there (in the window since the bind: the worker; its API server and engine front
stay free to run on the owner's other cores, and what they use there says nothing of the bound
cores), else its whole process group; a server of several ranks, rank by rank (`judge()`). It was
starved when, over the window, all three hold:

    used    those processes used less than STARVED_CORES of one core (a start-up that gets its
            CPU keeps about one core busy: import, weights, compile and the KV cache, one at a time);
    waited  their main threads waited for a CPU at least WAITED_SHARE of the time (skipped where
            the kernel keeps no schedstat): a server stuck on a lock or the network waits for
            nothing and is not starved;
    others  other processes took at least OTHERS_BUSY of its cores' time.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field, replace

import psutil

from optimizer.engine.failures import Failure

STARVED_CORES = 0.25
WAITED_SHARE = 0.5
OTHERS_BUSY = 0.5
MIN_WINDOW_S = 5.0  # two or three samples: the counters are cumulative, so that is enough to read a share
SAMPLE_S = 2.0
NAMED = 3  # the busiest other processes named
NAMED_MIN_CORES = 0.05  # below this share of a core a process is not worth naming
LABEL_CHARS = 60
BIND_VAR = "VLLM_CPU_OMP_THREADS_BIND"

Key = tuple  # (pid, create time): a pid the OS reuses is another process


@dataclass(frozen=True)
class _Sample:
    at: float
    cpu: dict  # Key -> CPU seconds (user + system), every process
    members: dict  # Key -> its main thread's run-queue wait in seconds (nan: unknown), the group's processes
    bound: frozenset  # cores the group's processes are bound to, narrower than the owner's
    cores: dict  # core -> busy seconds
    bound_members: frozenset = frozenset()  # Keys of the group's processes bound that narrowly
    member_cores: dict = field(default_factory=dict)  # Key -> the cores it is bound to, for those processes


@dataclass(frozen=True)
class Neighbour:
    """Another process that used the server's cores."""

    pid: int
    label: str  # its command, short
    cores: float  # the CPU it used over the window, in cores (1.0: one core all the time)
    pinned: bool = False  # bound to the server's cores: all of that CPU was theirs


@dataclass(frozen=True)
class CpuShare:
    """What a server's start-up got of the CPU over the judged window."""

    seconds: float  # the window's length
    used: float  # the server's processes judged (module docstring), in cores
    waited: float | None  # their main threads' run-queue wait, per second of the window (None: unknown)
    cores: tuple[int, ...]  # the cores it ran on (bound to, else all its owner may use)
    others_busy: float  # the share of those cores' time other processes took
    others: tuple[Neighbour, ...] = ()  # the busiest of them, busiest first
    since_bind: bool = False  # the window starts where the server bound itself to its cores
    min_window_s: float = MIN_WINDOW_S  # a shorter window says nothing
    server_cores: tuple[int, ...] = ()  # every core the server's ranks hold, where `cores` is one rank's

    @property
    def starved(self) -> bool:
        return (self.seconds >= self.min_window_s and self.used < STARVED_CORES and self.others_busy >= OTHERS_BUSY
                and (self.waited is None or self.waited >= WAITED_SHARE))

    def describe(self) -> str:
        """One line, the other processes first (a console shows the start of it)."""
        who = ", ".join(f"pid {n.pid} ({n.label}) {n.cores:.2f} core" for n in self.others) or "none named"
        wait = f", waiting for a CPU {min(self.waited, 1.0):.0%} of the time" if self.waited is not None else ""
        since = "since its worker bound itself there" if self.since_bind else "of its start-up"
        mine = "its processes bound there" if self.since_bind else "the server's processes"
        return (f"core(s) {cpu_list(self.cores)} went to other processes ({self.others_busy:.0%} of their time: {who}); "
                f"{mine} used {self.used:.2f} of a core{wait}, over {self.seconds:.0f} s {since}")

    def as_dict(self) -> dict:
        return {"seconds": round(self.seconds, 1), "used_cores": round(self.used, 3),
                "waited": None if self.waited is None else round(self.waited, 3), "cores": list(self.cores),
                "others_busy": round(self.others_busy, 3), "since_bind": self.since_bind, "starved": self.starved,
                "others": [{"pid": n.pid, "label": n.label, "cores": round(n.cores, 3)} for n in self.others]}


@dataclass
class CpuWatch:
    """Samples a starting server's process group `pgid` (call `maybe_sample()` as it starts, `judge()` at the end)."""

    pgid: int
    owner_cores: frozenset = field(default_factory=lambda: frozenset(os.sched_getaffinity(0)))
    samples: list = field(default_factory=list)

    def maybe_sample(self) -> None:
        """A sample, unless the last one is younger than SAMPLE_S."""
        if not self.samples or time.monotonic() - self.samples[-1].at >= SAMPLE_S:
            self.sample()

    def sample(self) -> None:
        self.samples.append(self._sample())

    def judge(self, min_window_s: float | None = None) -> CpuShare:
        """What the server got of the CPU (module docstring), from a last sample taken now. Where its
        ranks (data- or tensor-parallel workers) bound themselves to cores of their own, each is
        judged on its cores, and the one starved worst is the server's: one rank that cannot start
        holds the others' start-up too."""
        min_window_s = MIN_WINDOW_S if min_window_s is None else min_window_s
        self.sample()
        end = self.samples[-1]
        first_bound = next((i for i, s in enumerate(self.samples) if s.bound), None)
        since_bind = first_bound is not None and end.at - self.samples[first_bound].at >= min_window_s
        window = self.samples[first_bound if since_bind else 0:]
        cores = tuple(sorted(set().union(*(s.bound for s in window)) or self.owner_cores))
        judged = set().union(*(s.bound_members for s in window)) if since_bind else None
        ranks = _ranks(window) if since_bind else {}
        if len(ranks) > 1:
            starved = [share for share in (self._share(window, tuple(sorted(c)), keys, True, min_window_s)
                                           for c, keys in ranks.items()) if share.starved]
            if starved:
                return replace(min(starved, key=lambda share: share.used), server_cores=cores)
        return self._share(window, cores, judged, since_bind, min_window_s)

    def _share(self, window: list, cores: tuple, judged: set | None, since_bind: bool, min_window_s: float) -> CpuShare:
        """The share of `cores` the processes `judged` (None: the whole group) got over `window`."""
        start, end, seconds = window[0], window[-1], max(window[-1].at - window[0].at, 1e-9)
        group_s = _group_cpu_there(window, set(cores))
        used_s = _group_delta(window, lambda s: {k: s.cpu.get(k, 0.0) for k in s.members if _in(k, judged)})
        waited_s = _group_delta(window, lambda s: {k: v for k, v in s.members.items() if _in(k, judged)})
        busy_s = sum(end.cores.get(c, 0.0) - start.cores.get(c, 0.0) for c in cores)
        own_s = _group_delta(window, lambda s: {k: v for k, v in s.cpu.items() if k[0] == os.getpid()})
        # All of the group's CPU (but what a process used while bound to other cores only), and this
        # process's (the trial's own: it replays the workload), is taken off those cores' busy time,
        # though some may have run on others (its unbound processes): a lower bound of the others' share. Processes pinned to those cores used them
        # for certain: their CPU is another (an unbound API server busy elsewhere hides nothing).
        members = set().union(*(s.members for s in window))
        others = _neighbours(start, end, members, set(cores), seconds)
        pinned = sum(n.cores for n in others if n.pinned) / len(cores)
        others_busy = max(max(0.0, busy_s - group_s - own_s) / (seconds * len(cores)), pinned)
        return CpuShare(seconds, used_s / seconds, None if math.isnan(waited_s) else waited_s / seconds, cores,
                        min(others_busy, 1.0), others, since_bind, min_window_s)

    def _sample(self) -> _Sample:
        cpu, members, bound, bound_members, member_cores = {}, {}, set(), set(), {}
        for proc in psutil.process_iter(["create_time", "cpu_times"]):
            times = proc.info["cpu_times"]
            if times is None:
                continue
            key = (proc.pid, proc.info["create_time"])
            cpu[key] = times.user + times.system
            try:
                if os.getpgid(proc.pid) != self.pgid:
                    continue
            except OSError:
                continue
            members[key] = _run_queue_wait(proc.pid)
            try:
                allowed = set(proc.cpu_affinity())
            except (OSError, psutil.Error):
                continue
            if allowed and not allowed >= self.owner_cores:
                bound |= allowed
                bound_members.add(key)
                member_cores[key] = frozenset(allowed)
        return _Sample(time.monotonic(), cpu, members, frozenset(bound), core_busy_seconds(), frozenset(bound_members),
                       member_cores)


def _ranks(window: list[_Sample]) -> dict:
    """The processes bound at the window's end, grouped by the cores they are bound to: one group a rank."""
    ranks: dict = {}
    for key, cores in window[-1].member_cores.items():
        ranks.setdefault(cores, set()).add(key)
    return ranks


def _group_cpu_there(window: list[_Sample], cores: set) -> float:
    """The group's CPU seconds over the window that may have run on `cores`: each sample interval's,
    less what a process used while bound (at the interval's start) to other cores only."""
    total = 0.0
    for a, b in zip(window, window[1:]):
        for key in b.members:
            theirs = a.member_cores.get(key)
            if theirs is None or theirs & cores:
                total += b.cpu.get(key, 0.0) - a.cpu.get(key, 0.0)
    return total


def _in(key: Key, judged: set | None) -> bool:
    return judged is None or key in judged


def _group_delta(window: list[_Sample], values) -> float:
    """The growth of a per-member counter over the window: each member's last value in the window
    less its value at the window's start (0 for one started since); nan if any value is unknown."""
    last: dict = {}
    for s in window:
        last.update(values(s))
    first = values(window[0])
    return sum(v - first.get(k, 0.0) for k, v in last.items())


def _neighbours(start: _Sample, end: _Sample, members: set, cores: set, seconds: float) -> tuple[Neighbour, ...]:
    """The busiest processes outside the group (and other than this one) that ran on `cores`: bound
    to them, or allowed there and last seen on one of them."""
    found = []
    for key, total in end.cpu.items():
        share = (total - start.cpu.get(key, 0.0)) / seconds
        if key in members or key[0] == os.getpid() or share < NAMED_MIN_CORES:
            continue
        try:
            proc = psutil.Process(key[0])
            allowed = set(proc.cpu_affinity())
            if not (allowed <= cores or (allowed & cores and proc.cpu_num() in cores)):
                continue
            found.append(Neighbour(key[0], process_label(proc), share, allowed <= cores))
        except (psutil.Error, OSError):
            continue
    return tuple(sorted(found, key=lambda n: -n.cores)[:NAMED])


def process_label(proc: psutil.Process) -> str:
    """A process's command, short: the program's base name and its first arguments."""
    try:
        argv = proc.cmdline()
    except (psutil.Error, OSError):
        argv = []
    if not argv:
        try:
            return proc.name()[:LABEL_CHARS]
        except (psutil.Error, OSError):
            return "?"
    text = " ".join(" ".join([os.path.basename(argv[0]), *argv[1:]]).split())  # a process title pads with blanks
    return text if len(text) <= LABEL_CHARS else text[:LABEL_CHARS - 3] + "..."


def _run_queue_wait(pid: int) -> float:
    """Seconds the process's main thread spent runnable but waiting for a CPU (nan: not kept)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return math.nan


def core_busy_seconds(stat: str = "/proc/stat") -> dict[int, float]:
    """Each core's busy time since boot, in seconds: everything but idle and I/O wait (a hypervisor's
    steal counts as busy: that time went to someone else)."""
    tick = os.sysconf("SC_CLK_TCK")
    busy = {}
    try:
        with open(stat) as f:
            for line in f:
                name, *fields = line.split()
                if name.startswith("cpu") and name[3:].isdigit() and len(fields) >= 8:
                    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
                    busy[int(name[3:])] = (user + nice + system + irq + softirq + steal) / tick
    except (OSError, ValueError):
        return {}
    return busy


def cpu_list(cores) -> str:
    """Cores as vLLM and taskset write them: "0-3,6"."""
    out: list[str] = []
    ordered = sorted(set(cores))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def starved_failure(share: CpuShare, owner_cores=None) -> Failure:
    """The failure of a start-up that timed out starved (`share.starved`): infrastructure, never the flags."""
    held = set(share.server_cores or share.cores)
    spare = sorted(set(owner_cores if owner_cores is not None else os.sched_getaffinity(0)) - held)
    bind = (f'bind trial servers to other cores (engine.env {BIND_VAR}: "{cpu_list(spare)}"), or ' if spare
            else "no other core is free here: ")
    return Failure("infra", f"start-up starved of CPU: {share.describe()}"[:1000],
                   f"{bind}run trials on another node (ray.resources) or while those processes are idle; "
                   "the trial is queued again")
