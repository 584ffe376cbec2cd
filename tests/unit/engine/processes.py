"""Clean-up for tests that start real processes: a process and everything it started."""

import psutil


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and its descendants (a child a test's process started would outlive it otherwise)."""
    try:
        proc = psutil.Process(pid)
        family = [*proc.children(recursive=True), proc]
    except psutil.NoSuchProcess:
        return
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
