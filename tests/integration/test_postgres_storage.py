"""PostgreSQL as the study storage, for real: a server from scripts/postgres_for_tests.sh (or
$VLLM_OPTIMIZER_TEST_PG_URL), opened through optimizer/driver/store/database.py the way the driver opens it.
No vLLM here. The database persists across runs: every study name is unique and deleted after.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import optuna
import pytest
from sqlalchemy.engine import make_url

from optimizer.driver.store.database import check_storage, normalize_url, open_storage
from optimizer.engine.tiny_model import write_tiny_model

pytestmark = pytest.mark.integration
PG_URL_ENV = "VLLM_OPTIMIZER_TEST_PG_URL"

TROUBLESHOOTING = Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md"


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_study_is_created_written_and_loaded_back_through_the_storage_layer(postgres_url):
    assert check_storage(postgres_url) is None  # a server, not a file: probed, nothing to check on disk
    assert normalize_url(postgres_url) == normalize_url(postgres_url, in_job=True) == postgres_url
    name = _unique("pg-storage")
    storage = open_storage(postgres_url)
    assert isinstance(storage, optuna.storages.RDBStorage)
    assert storage.engine.dialect.name == "postgresql"
    try:
        study = optuna.create_study(study_name=name, storage=storage, direction="minimize")
        study.set_user_attr("objective", "latency:ttft_p95")
        study.enqueue_trial({"max-num-seqs": 16}, user_attrs={"baseline": True})
        trial = study.ask()
        assert trial.suggest_int("max-num-seqs", 1, 64) == 16  # the enqueued value, read back from the server
        study.tell(trial, 123.5)
        pruned = study.ask()
        pruned.set_user_attr("failure_kind", "kv_too_small")
        study.tell(pruned, state=optuna.trial.TrialState.PRUNED)

        # A second connection, the driver's way, and a plain Optuna one on the URL: the same study.
        again = optuna.load_study(study_name=name, storage=open_storage(postgres_url))
        plain = optuna.load_study(study_name=name, storage=postgres_url)
        for loaded in (again, plain):
            assert loaded.user_attrs == {"objective": "latency:ttft_p95"}
            assert [(t.number, t.state, t.value) for t in loaded.trials] == [
                (0, optuna.trial.TrialState.COMPLETE, 123.5), (1, optuna.trial.TrialState.PRUNED, None)]
            assert loaded.trials[0].params == {"max-num-seqs": 16}
            assert loaded.trials[0].user_attrs == {"baseline": True}
            assert loaded.trials[1].user_attrs == {"failure_kind": "kv_too_small"}
            assert loaded.best_trial.number == 0
        assert name in optuna.get_all_study_names(postgres_url)
    finally:
        optuna.delete_study(study_name=name, storage=storage)
    assert name not in optuna.get_all_study_names(postgres_url)


def _refused_line(url: str) -> str:
    parsed = make_url(url)
    shown = parsed.render_as_string(hide_password=True)
    return (f"error: storage '{shown}' refused the login (password authentication failed for user "
            f"\"{parsed.username}\"); check the user name and password in the URL")


def test_wrong_credentials_get_one_line_exit_2_no_password_and_nothing_written(postgres_url, tmp_path):
    """Bad input "a PostgreSQL URL with wrong credentials" (docs/troubleshooting.md)."""
    model = write_tiny_model(tmp_path / "tiny")
    work = tmp_path / "work"
    work.mkdir()
    (work / "study.yaml").write_text(f"model: {{path: {model}}}\nspace: {{max-num-seqs: {{low: 4, high: 8}}}}\n")
    wrong = make_url(postgres_url).set(password="WRONG-pw-4711")
    wrong_url = wrong.render_as_string(hide_password=False)
    name = _unique("pg-wrong-login")
    before = _files(work)
    run = subprocess.run([sys.executable, "-m", "optimizer", "run", "--config", "study.yaml", "--storage", wrong_url,
                          "--study-name", name], capture_output=True, text=True, timeout=120, cwd=work)
    assert run.returncode == 2, run.stderr + run.stdout
    assert run.stderr.splitlines() == [_refused_line(postgres_url)]
    assert "WRONG-pw-4711" not in run.stderr + run.stdout
    assert _files(work) == before  # no artifacts dir, no lock, no run-state
    assert name not in optuna.get_all_study_names(postgres_url)
    # docs/troubleshooting.md quotes the line for the URL scripts/postgres_for_tests.sh prints.
    readme_line = _refused_line("postgresql://optimizer:optimizer@127.0.0.1:5432/optimizer_test")
    assert f"`` {readme_line} ``" in TROUBLESHOOTING.read_text()


HOLDER = ("import sys, time\nfrom optimizer.driver.store.driver_lock import RunState\n"
          "held = RunState(sys.argv[1], sys.argv[2], sys.argv[3])\nheld.acquire()\nprint('held', flush=True)\n"
          "time.sleep(600)\n")


def test_two_drivers_of_one_postgresql_study_from_two_artifacts_directories_never_both_run(postgres_url, tmp_path):
    """The file lock sees only drivers sharing an artifacts directory; the study's advisory lock is the
    database's, as another host would see it. The second driver is refused before any recovery; another
    study runs beside; a SIGKILLed holder's lock goes with its connection."""
    import os
    import signal
    import socket
    import time

    from optimizer.driver.store.driver_lock import RunState
    from optimizer.errors import ConfigError

    study = _unique("pg-lock")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, postgres_url, str(tmp_path / "a"), study],
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        assert holder.stdout.readline().strip() == "held"
        second = RunState(postgres_url, tmp_path / "b", study)
        with pytest.raises(ConfigError) as refused:
            second.acquire()
        assert str(refused.value) == (f"study '{study}' in {make_url(postgres_url).render_as_string(hide_password=True)} "
                                      f"is in use by another driver ({socket.gethostname()}:{holder.pid} from "
                                      f"127.0.0.1); stop it first, or pass --study-name NEW")
        assert not (tmp_path / "b").exists() or not any((tmp_path / "b").rglob("*.runstate.json"))
        with RunState(postgres_url, tmp_path / "c", _unique("pg-lock-other")) as beside:
            beside.acquire()  # another study of the same database: its own lock
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        deadline = time.monotonic() + 10
        while True:  # the server ends the dead driver's session, and its lock with it
            try:
                with RunState(postgres_url, tmp_path / "b", study) as after:
                    after.acquire()
                break
            except ConfigError:
                assert time.monotonic() < deadline, "the killed driver's lock outlived its connection by 10 s"
                time.sleep(0.2)
    finally:
        holder.kill()
        holder.wait(10)


def _restart_local_postgres(down_s: float) -> None:
    """Stop the Debian cluster the tests use, keep it down `down_s`, start it again."""
    import time

    version, name = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True, check=True).stdout.split()[:2]
    subprocess.run(["pg_ctlcluster", version, name, "stop", "-m", "fast"], check=True, capture_output=True)
    time.sleep(down_s)
    subprocess.run(["pg_ctlcluster", version, name, "start"], check=True, capture_output=True)


def test_a_generation_rides_out_a_postgresql_restart_and_loses_nothing(postgres_url, tmp_path):
    """The daemon's retry (driver/store/storage_loss.py) around a generation's own writes to a real
    PostgreSQL, restarted in the middle (down 3 s): the loss is heard, the study lock taken again,
    the generation resumes its study, every trial told before the restart is there, and the one
    in flight is told FAIL with the loss as its evidence and queued again."""
    import threading
    import time

    from optimizer.driver.store.storage_loss import retrying
    from optimizer.driver.recovery import recover
    from optimizer.driver.store.driver_lock import RunState

    if os.environ.get(PG_URL_ENV):
        pytest.skip(f"{PG_URL_ENV} names an outside server this test cannot restart")
    name = _unique("pg-restart")
    optuna.create_study(study_name=name, storage=open_storage(postgres_url))
    held = RunState(postgres_url, tmp_path / "artifacts", name)
    held.acquire()
    losses, started = [], time.monotonic()

    def generation():
        study = optuna.load_study(study_name=name, storage=open_storage(postgres_url))
        recover(study, held.previous)
        while sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials) < 30:
            trial = study.ask()
            time.sleep(0.15)  # measuring
            study.tell(trial, 1.0)
        return study

    def lost(why, wait):
        losses.append((round(time.monotonic() - started, 1), why))
        held.previous = {"storage_lost": why}

    relocked = []

    def relock():
        held.relock()
        relocked.append(time.monotonic() - started)

    back = []
    restart = threading.Thread(target=lambda: (time.sleep(1.5), _restart_local_postgres(3.0),
                                               back.append(time.monotonic() - started)))
    restart.start()
    try:
        study = retrying(generation, lost, relock)
    finally:
        restart.join(60)
        held.release()
    resumed_after = time.monotonic() - started
    trials = optuna.load_study(study_name=name, storage=open_storage(postgres_url)).trials
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert losses and len(complete) == 30 and study.study_name == name
    assert "Optuna" not in losses[0][1] and "invalid data" not in losses[0][1]  # the driver's own error, not a guess
    assert all(t.user_attrs["evidence"].startswith("the storage was lost while this trial ran") for t in failed)
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    print(f"\nlosses heard: {losses}; the database back at {back[0]:.1f} s, the lock taken again at "
          f"{relocked[0]:.1f} s; the generation finished {resumed_after:.1f} s after it began "
          f"({len(failed)} trial(s) in flight at the loss, told FAIL and queued again)")
