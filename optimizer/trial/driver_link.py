"""The trial's side of the driver channel: what a running trial tells the driver (its phase, its
server's process group, stage checkpoints) and what the driver answers (go on, or stop). `Driver`
talks to nobody (tests, a bare execute_trial); channel.py's BoardDriver carries it through Ray.
"""

from __future__ import annotations


class Driver:
    """What a trial tells the driver while it runs, and what the driver answers. The default
    talks to nobody (tests, a bare `execute_trial`); channel.BoardDriver routes through Ray."""

    def phase(self, phase: str) -> None:
        pass

    def spawned(self, pgid: int) -> None:
        pass

    def checkpoint(self, step: int, payload: dict) -> None:
        pass

    def stop_reason(self) -> str:
        """Non-empty once the driver has decided this trial cannot win (never blocks)."""
        return ""

    def verdict(self, step: int, wait_s: float) -> str:
        """Wait up to `wait_s` for the driver's answer to checkpoint `step`; the stop reason or ''."""
        return self.stop_reason()

    def close(self) -> None:
        pass

    def health(self) -> dict:
        """How the channel to the driver fared (BoardDriver: verdict polls, errors)."""
        return {}
