"""Whether a measured run had its cores: a run during which other processes took a good share of
the server's cores measured the machine's other work as much as the configuration, and is measured
again rather than pooled with the runs that had them.

The trial records what the server got of the CPU while it was measured (engine/starvation.py
CpuWatch, judged over the replay: `replay_cpu`): the share of its cores' time that other processes
took (the trial's own process, which sends the requests, and the server's are not others), and the
busiest of them by name; for a server of several ranks, the starved rank's cores where one was. A quiet 2-core machine showed 0-0.06 there; a busy loop pinned to the
server's core took 0.37-0.40 (bench/disturbed_run.py).
"""

from __future__ import annotations

DISTURBED_SHARE = 0.25  # other processes took at least this share of the server's cores' time
MIN_SECONDS = 2.0  # a shorter window says nothing


def disturbance(replay_cpu: dict | None) -> str:
    """'' when the run had its cores; else why it did not, in words."""
    if not replay_cpu or (replay_cpu.get("seconds") or 0.0) < MIN_SECONDS:
        return ""
    share = replay_cpu.get("others_busy") or 0.0
    if share < DISTURBED_SHARE:
        return ""
    who = ", ".join(f"pid {o['pid']} ({o['label']}) {o['cores']:.2f} core" for o in replay_cpu.get("others") or [])
    return (f"other processes took {share:.0%} of its cores' time while it was measured ({who or 'none named'}); "
            "something else is using the machine")
