"""The driver tests' shared stand-in for a trial's Ray task."""

import pytest

from optimizer.driver import launch as launch_mod


@pytest.fixture
def booted(monkeypatch) -> list:
    """launch() starts no Ray task: the params each trial would have booted are recorded here."""
    params = []

    class Task:  # stands for the Ray task: records what would have booted
        @staticmethod
        def options(**_):
            return Task

        @staticmethod
        def remote(spec, board):
            params.append(spec.params)
            return "ref"

    monkeypatch.setattr(launch_mod, "run_trial", Task)
    return params
