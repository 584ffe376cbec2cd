"""The cores a trial's vLLM server binds its worker to on a CPU node: ones no other vLLM server is on.

vLLM on CPU binds its worker's threads to the cores VLLM_CPU_OMP_THREADS_BIND names (vLLM 0.32,
vllm/utils/ompmultiprocessing.py: "0-3" or "0,2" for one rank, "0-3|4-7" for several, "nobind",
or "auto", the default). "auto" takes one logical CPU per physical core of the first NUMA node
the process may use, less the last one, kept for vLLM's other processes: every server on a
machine lands on the same first cores. A trial beside a production server on the same machine
would share production's cores, and at Ray's worker priority get almost none of them
(engine/starvation.py).

`bind_free_cores(server)`, just before a server starts: unless VLLM_CPU_OMP_THREADS_BIND is set
already (by the operator's engine.env or environment, or the driver's parallel slots), and when
another vLLM process on the machine is bound to some of the cores this one may use, the worker
is bound to the others, chosen the way "auto" chooses (`choose`). A vLLM process is one whose
command, or an ancestor's, is vLLM's (`vllm serve`, `-m vllm.…`, a `VLLM::` process title); it
is bound to the cores it may run on when those are not all of this process's, or to the cores its
own VLLM_CPU_OMP_THREADS_BIND names (a server still starting). With no other vLLM process bound,
or no core left, vLLM's own binding is kept. What was chosen, and why, is a note in the server log.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import psutil

from optimizer.engine.device import gpu_count
from optimizer.engine.starvation import BIND_VAR, cpu_list, process_label

SYS_CPU = Path("/sys/devices/system/cpu")
_VLLM = re.compile(r"(^|[\s/])vllm(\s|$)|(^|[\s/])vllm\.|^VLLM::")
_RANKS = re.compile(r"^(--tensor-parallel-size|-tp|--pipeline-parallel-size|-pp|--data-parallel-size|-dp)(=(.*))?$")


@dataclass(frozen=True)
class Bound:
    """Another vLLM process and the cores it is bound to."""

    pid: int
    label: str
    cores: frozenset


def parse_cpu_list(text: str) -> set[int]:
    """The cores of a list such as "0-3,6" (ranks' lists "0-3|4-7" together); empty if it is none."""
    cores: set[int] = set()
    for part in re.split(r"[,|]", text.strip()):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return set()
        cores.update(range(int(lo), int(hi or lo) + 1))
    return cores


def is_vllm(proc: psutil.Process) -> bool:
    """Whether the process, or one of its ancestors, runs vLLM (its workers start as plain Python)."""
    try:
        for p in (proc, *proc.parents()):
            if _VLLM.search(" ".join(p.cmdline())):
                return True
    except (psutil.Error, OSError):
        return False
    return False


def vllm_bindings(processes=None, mine=None) -> list[Bound]:
    """Every vLLM process (of `processes`, default all) bound to only some of the cores in `mine`
    (default: the cores this process may use), with those cores."""
    mine = set(mine if mine is not None else os.sched_getaffinity(0))
    found = []
    for proc in processes if processes is not None else psutil.process_iter():
        try:
            if proc.pid == os.getpid() or not is_vllm(proc):
                continue
            allowed = set(proc.cpu_affinity()) & mine
            if allowed >= mine:
                allowed = _declared(proc) & mine
            if allowed:
                found.append(Bound(proc.pid, process_label(proc), frozenset(allowed)))
        except (psutil.Error, OSError):
            continue
    return found


def _declared(proc: psutil.Process) -> set[int]:
    """The cores a vLLM process's own VLLM_CPU_OMP_THREADS_BIND names (empty: none, auto, or unreadable)."""
    try:
        return parse_cpu_list(proc.environ().get(BIND_VAR, ""))
    except (psutil.Error, OSError):
        return set()


def choose(mine, taken, sys_cpu: Path = SYS_CPU) -> list[int]:
    """The cores for one worker among `mine` less `taken`, as "auto" picks among all: one logical CPU
    per physical core with no CPU taken (the last sibling), on the NUMA node with the most such
    cores, less the last one when two or more are left. Empty when no core is free."""
    taken = set(taken)
    by_node: dict[int, list[int]] = {}
    for cpu in sorted(set(mine) - taken):
        siblings = _siblings(cpu, sys_cpu)
        if siblings & taken or cpu != max(siblings & set(mine) or {cpu}):
            continue
        by_node.setdefault(_node(cpu, sys_cpu), []).append(cpu)
    if not by_node:
        return []
    best = max(by_node.values(), key=len)
    return best[:-1] if len(best) >= 2 else best


def _siblings(cpu: int, sys_cpu: Path) -> set[int]:
    try:
        return parse_cpu_list((sys_cpu / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text()) or {cpu}
    except OSError:
        return {cpu}


def _node(cpu: int, sys_cpu: Path) -> int:
    try:
        names = [p.name for p in (sys_cpu / f"cpu{cpu}").glob("node*")]
    except OSError:
        return 0
    return min((int(n[4:]) for n in names if n[4:].isdigit()), default=0)


def rank_count(args) -> int:
    """How many workers the flags start: tensor x pipeline x data parallel sizes (1 when none)."""
    args, count = list(args), 1
    for i, arg in enumerate(args):
        m = _RANKS.match(arg)
        if m:
            value = m.group(3) if m.group(2) else (args[i + 1] if i + 1 < len(args) else "1")
            count *= int(value) if value.strip().isdigit() else 1
    return count


def rank_cores(cores, count: int) -> str:
    """`cores` split into `count` equal lists joined by `|`, one per rank, as VLLM_CPU_OMP_THREADS_BIND
    takes them ([0, 1] -> "0|1"; [0..4] -> "0-1|2-3", the last core left to vLLM's API server when
    there is one to spare). '' when there are fewer cores than ranks."""
    cores = sorted(cores)
    if count < 1 or len(cores) < count:
        return ""
    share = (len(cores) - 1) // count if len(cores) > count else 1
    return "|".join(cpu_list(cores[i * share:(i + 1) * share]) for i in range(count))


def bind_free_cores(server, others: list[Bound] | None = None) -> str:
    """Call just before `server.start()` on the node that runs it: sets the server's
    VLLM_CPU_OMP_THREADS_BIND to cores no other vLLM process is bound to (module docstring), and
    notes what was chosen in its log. `others`: the vLLM processes to keep clear of (default: all
    found on this machine). Returns the note (empty on a GPU node, where vLLM binds nothing)."""
    if server.env.get("CUDA_VISIBLE_DEVICES") or gpu_count():
        return ""
    mine = set(os.sched_getaffinity(0))
    others = vllm_bindings(mine=mine) if others is None else others
    taken = set().union(*(o.cores for o in others)) & mine
    who = ", ".join(f"pid {o.pid} ({o.label}) on {cpu_list(o.cores)}" for o in others)
    given = server.env.get(BIND_VAR, os.environ.get(BIND_VAR))
    if given is not None:
        shared = parse_cpu_list(given) & taken
        note = f"CPU cores: {BIND_VAR}={given} given (engine.env, the environment, or a parallel trial's slot): kept"
        if shared:
            note += f"; other vLLM processes are bound to core(s) {cpu_list(shared)} too: {who}"
    elif (ranks := rank_count(server.args)) > 1:
        note = _bind_ranks(server, ranks, sorted(mine - taken), who)
    elif not taken:
        note = f"CPU cores: no other vLLM process is bound to this trial's cores ({cpu_list(mine)}): vLLM's own binding"
    elif not (chosen := choose(mine, taken)):
        note = (f"CPU cores: no core free of other vLLM processes ({who}): vLLM's own binding kept; "
                f"this server shares their cores (engine.env {BIND_VAR} picks others)")
    else:
        server.env[BIND_VAR] = cpu_list(chosen)
        note = f"CPU cores: worker bound to {cpu_list(chosen)} ({BIND_VAR}), clear of other vLLM processes: {who}"
    server.notes.append(note)
    return note


def _bind_ranks(server, ranks: int, free: list[int], who: str) -> str:
    """Each of several workers on cores of its own, among those free of other vLLM processes."""
    beside = f", beside {who}" if who else ""
    groups = rank_cores(free, ranks)
    if not groups:
        return (f"CPU cores: {ranks} workers but only {len(free)} free core(s) ({cpu_list(free)}): vLLM's own "
                f"binding{beside}; the workers share cores")
    server.env[BIND_VAR] = groups
    return f"CPU cores: {ranks} workers bound to {groups} ({BIND_VAR}), one list each{beside}"
