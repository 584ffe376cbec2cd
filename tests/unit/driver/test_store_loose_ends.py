"""driver/store/: the storage's loose ends, through the real command line (`optimizer.cli.main`).

- a storage whose directory takes no files is refused in one line (exit 2), not a traceback
  from the driver lock;
- the commands that only read a study (report, plan) leave its file byte for byte as it was:
  no switch to WAL mode, no note written, no `-wal`/`-shm` left beside it;
- a bad input refused after the storage was opened leaves no `-wal`/`-shm` either (the docs
  promise only the lock file may appear).

Tests run as root, where a chmod does not stop a write: /proc (no new files, even for root)
and a regular file in the path stand in for a directory that is not writable; a real read-only
mount is made in a private mount namespace where the machine allows it (else skipped).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import ray

from optimizer.cli import main
from optimizer.driver.store.database import close_storage, open_storage
from optimizer.driver.store.driver_lock import RunState
from optimizer.record.version import RECORD_KEY, RECORD_VERSION
from optimizer.errors import StorageError

SPACE = "space: {max-num-seqs: {low: 4, high: 8}}\n"  # keeps the node's memory out of these tests
REPO = Path(__file__).resolve().parents[3]
TROUBLESHOOTING = REPO / "docs" / "troubleshooting.md"
NO_FILES_HERE = "/proc"  # a directory that exists and takes no new file, even as root
DIST = {"max-num-seqs": optuna.distributions.IntDistribution(4, 8)}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPTIMIZER_STATUS_TOKEN", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    (tmp_path / "study.yaml").write_text(SPACE)
    return tmp_path


def _cli(capsys, *argv: str) -> tuple[int, list[str]]:
    code = main(list(argv))
    return code, capsys.readouterr().err.splitlines()


def _files(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its bytes, -wal and -shm included (only the lock file is left out)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.endswith(".lock")}


def _sidecars(db: Path) -> list[str]:
    return sorted(p.name for p in db.parent.iterdir() if p.name in (db.name + "-wal", db.name + "-shm"))


def _journal_mode(db: Path) -> str:
    con = sqlite3.connect(f"file:{db}?mode=rw", uri=True)  # (mode=ro would leave a WAL file's -wal and -shm)
    try:
        return con.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        con.close()


# --- 1. a storage directory that takes no files ---------------------------------------------------

LOCK_LINE = ("storage sqlite:///{d}/trials.db: cannot create its lock file {d}/trials.db.lock (No such file or "
             "directory); pass --storage with a writable directory")


@pytest.mark.parametrize("command", [["run"], ["daemon", "--status-port", "0"],
                                     ["regress", "--candidate", "kv-cache-dtype=fp8"]],
                         ids=["run", "daemon", "regress"])
def test_a_storage_directory_that_takes_no_files_is_one_line_before_anything_starts(command, workdir, capsys,
                                                                                   tiny_model):
    code, err = _cli(capsys, *command, "--config", "study.yaml", "--model", str(tiny_model),
                     "--storage", f"sqlite:///{NO_FILES_HERE}/trials.db")
    assert code == 2, err
    assert err == ["error: " + LOCK_LINE.format(d=NO_FILES_HERE)]
    assert not ray.is_initialized()  # refused before Ray (or any vLLM) started
    assert sorted(p.name for p in workdir.iterdir()) == ["study.yaml"]


def test_report_of_a_storage_there_says_there_is_no_study_database(workdir, capsys, tiny_model):
    code, err = _cli(capsys, "report", "--config", "study.yaml", "--model", str(tiny_model),
                     "--storage", f"sqlite:///{NO_FILES_HERE}/trials.db")
    assert (code, err) == (2, [f"error: no study database at {NO_FILES_HERE}/trials.db: run `python -m optimizer "
                               "run` first, or pass --storage"])


def test_a_file_in_the_storage_path_is_named_as_a_file_not_a_missing_directory(workdir, capsys, tiny_model):
    (workdir / "afile").write_text("not a directory\n")
    before = _files(workdir)
    code, err = _cli(capsys, "run", "--config", "study.yaml", "--model", str(tiny_model),
                     "--storage", "sqlite:///afile/trials.db")
    assert code == 2
    assert err == [f"error: storage {workdir}/afile/trials.db: {workdir}/afile is a file, not a directory; pass "
                   "--storage with a path in a directory"]
    assert _files(workdir) == before


def test_the_lock_file_of_a_database_server_lives_in_the_artifacts_dir_whose_fix_is_named(tmp_path):
    (tmp_path / "afile").write_text("")
    state = RunState("postgresql://tuner:s3cret@db:5432/optuna", tmp_path / "afile" / "artifacts")
    with pytest.raises(StorageError) as err:
        state.acquire()
    message = str(err.value)
    assert message.startswith(f"storage postgresql://tuner:***@db:5432/optuna: cannot create its lock file "
                              f"{tmp_path}/afile/artifacts/storage-")
    assert message.endswith(".lock (Not a directory); pass --artifacts-dir with a writable directory")
    assert "s3cret" not in message
    state.release()  # never acquired: nothing to release, and no error


# --- 2. read-only commands leave the file byte for byte ------------------------------------------

def _trial(value: float, seqs: int, baseline: bool = False) -> optuna.trial.FrozenTrial:
    metrics = {"output_throughput": value, "total_token_throughput": 2 * value, "request_throughput": value / 50,
               "ttft_ms_p95": 120.0, "tpot_ms_p95": 20.0, "completed": 40.0, "error_rate": 0.0}
    attrs = {"vllm_args": ["--max-num-seqs", str(seqs)], "metrics": metrics, **({"baseline": True} if baseline else {})}
    return optuna.trial.create_trial(value=value, params={"max-num-seqs": seqs}, distributions=DIST, user_attrs=attrs)


def _stored_study(db: Path) -> None:
    """Study 'tune' with two COMPLETE trials (baseline 100 tok/s, best 150), in a file Optuna itself made
    (its default rollback journal); its storage closed again, as a finished run leaves it."""
    storage = optuna.storages.RDBStorage(f"sqlite:///{db}")
    study = optuna.create_study(study_name="tune", storage=storage, direction="maximize")
    study.set_user_attr(RECORD_KEY, RECORD_VERSION)  # as the tool stamps its studies
    study.set_user_attr("objective", "throughput:output_throughput")
    study.add_trial(_trial(100.0, 4, baseline=True))
    study.add_trial(_trial(150.0, 8))
    close_storage(storage)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


READERS = [
    ("report", ["report"]),
    ("plan", ["plan", "--peak-qps", "5", "--tokens-per-request", "200"]),
]


@pytest.mark.parametrize("journal", ["delete", "wal"])
@pytest.mark.parametrize("name, argv", READERS, ids=[r[0] for r in READERS])
def test_a_read_only_command_leaves_the_study_file_byte_for_byte(name, argv, journal, workdir, capsys, tiny_model):
    db = workdir / "trials.db"
    _stored_study(db)
    if journal == "wal":  # as `run` leaves it
        with sqlite3.connect(db) as con:
            con.execute("PRAGMA journal_mode=WAL")
        con.close()
    assert _journal_mode(db) == journal and _sidecars(db) == []
    before = _sha(db)
    code, err = _cli(capsys, *argv, "--config", "study.yaml", "--model", str(tiny_model), "--study-name", "tune")
    assert code == 0, err
    assert _sha(db) == before
    assert _journal_mode(db) == journal
    assert _sidecars(db) == []  # no -wal / -shm left by the reads (none is held open)
    if name == "report":
        assert (workdir / "artifacts" / "tune" / "report" / "report.html").is_file()


def test_a_report_of_an_empty_file_writes_no_tables_into_it(workdir, capsys, tiny_model):
    (workdir / "trials.db").write_bytes(b"")
    code, err = _cli(capsys, "report", "--config", "study.yaml", "--model", str(tiny_model))
    assert (code, err) == (2, [f"error: no study database at {workdir}/trials.db: run `python -m optimizer run` "
                               "first, or pass --storage"])
    assert (workdir / "trials.db").read_bytes() == b"" and sorted(p.name for p in workdir.iterdir()) == [
        "study.yaml", "trials.db"]


def test_the_daemon_s_look_at_its_generations_changes_no_byte(tmp_path):
    from optimizer.driver.store.database import study_attrs

    db = tmp_path / "trials.db"
    _stored_study(db)
    before = _sha(db)
    assert study_attrs(f"sqlite:///{db}") == [("tune", {RECORD_KEY: RECORD_VERSION,
                                                        "objective": "throughput:output_throughput"})]
    assert _sha(db) == before and _journal_mode(db) == "delete" and _sidecars(db) == []


def test_open_storage_read_only_keeps_the_journal_mode_and_a_writer_turns_on_wal(tmp_path):
    db = tmp_path / "trials.db"
    _stored_study(db)
    before = _sha(db)
    reader = open_storage(f"sqlite:///{db}", read_only=True)
    assert [s.study_name for s in optuna.get_all_study_summaries(reader, include_best_trial=False)] == ["tune"]
    assert len(optuna.load_study(study_name="tune", storage=reader).trials) == 2
    assert _sha(db) == before and _journal_mode(db) == "delete" and _sidecars(db) == []
    writer = open_storage(f"sqlite:///{db}")
    assert _journal_mode(db) == "wal"
    close_storage(writer)


# --- 3. a refusal after the storage was opened leaves no -wal / -shm -----------------------------

def _wal_study(workdir: Path, name: str = "tune", **attrs) -> None:
    """A study in a database opened the way the driver opens it (WAL mode), closed again."""
    storage = open_storage(f"sqlite:///{workdir / 'trials.db'}")
    study = optuna.create_study(study_name=name, storage=storage)
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    close_storage(storage)


STAMPED = {"objective": "latency:ttft_p95", "workload_hash": "0" * 64, "model": "/m"}
FOREIGN = ("study 'tune' was not made by vllm-optimizer (it holds attributes owner and no stamp of this tool): pass "
           "--study-name NEW; the study is left as it is")
# (id, command, extra config, setup, the exact line): rows of docs/troubleshooting.md refused once the
# storage was checked (read) or opened, with a study (WAL mode, as `run` leaves it) already there
OPENED_ROWS = [
    ("other-objective", ["run"], "", lambda d: _wal_study(d, **STAMPED),
     "study 'tune' was run with another objective (latency:ttft_p95); pass --new-study to start a separate study "
     "(the old one is kept), or --study-name NEW"),
    ("no-matching-resources", ["run"], "ray: {trial_cpus: 4096}\n", _wal_study,
     "ray: no node in the embedded local Ray can run a trial asking for CPU=4096 (largest node: CPU=<cores>; "
     "the cluster has no custom resources); lower ray.trial_cpus, or the parallel sizes (one core per rank), "
     "or add a node that has them"),
    ("missing-prompts-file", ["run"], "regression: {enabled: true, prompts_file: prompts.txt}\n", _wal_study,
     "regression.prompts_file prompts.txt: cannot read it (No such file or directory); give a UTF-8 text file "
     "with one prompt per line"),
    ("report-of-another-study", ["report"], "", lambda d: _wal_study(d, "other"),
     "no study 'tune' in sqlite:///<dir>/trials.db (it holds: other); pass --study-name, or run "
     "`python -m optimizer run` first"),
    ("report-other-objective", ["report"], "", lambda d: _wal_study(d, **STAMPED),
     "study 'tune' was run with objective latency:ttft_p95, the config says throughput:output_throughput; pass the "
     "config (or --goal / --objective / --slo) it ran with"),
    ("foreign-study", ["run"], "", lambda d: _wal_study(d, owner="another tool"), FOREIGN),
    ("report-of-a-foreign-study", ["report"], "", lambda d: _wal_study(d, owner="another tool"), FOREIGN),
    ("newer-record", ["run"], "", lambda d: _wal_study(d, **STAMPED, **{RECORD_KEY: RECORD_VERSION + 1}),
     f"study 'tune' was written by a newer vllm-optimizer (study record version {RECORD_VERSION + 1}; this one "
     f"reads up to {RECORD_VERSION}): upgrade vllm-optimizer, or pass --study-name NEW"),
    ("plan-before-a-completed-trial", ["plan", "--peak-qps", "50", "--tokens-per-request", "2000"], "", _wal_study,
     "study 'tune' has no completed trial: nothing measured to plan on; run `python -m optimizer run` until one "
     "completes"),
]


def _normalize(line: str, workdir: Path) -> str:
    return line.replace(str(workdir), "<dir>").replace(f"CPU={os.cpu_count()};", "CPU=<cores>;")


@pytest.mark.parametrize("case", OPENED_ROWS, ids=[c[0] for c in OPENED_ROWS])
def test_a_refusal_after_the_storage_was_read_leaves_no_wal_or_shm(case, workdir, capsys, tiny_model):
    _, command, config, setup, expected = case
    (workdir / "study.yaml").write_text(SPACE + config)
    setup(workdir)
    db = workdir / "trials.db"
    assert _sidecars(db) == []
    before = _files(workdir)
    code, err = _cli(capsys, *command, "--config", "study.yaml", "--model", str(tiny_model), "--study-name", "tune",
                     "--storage", "sqlite:///trials.db")
    assert code == 2, err
    assert [_normalize(line, workdir) for line in err] == [f"error: {expected}"]
    assert _sidecars(db) == []  # checked while this process still runs: nothing is held open
    assert _files(workdir) == before


@pytest.mark.parametrize("command", [["run"], ["daemon", "--status-port", "0"]], ids=["run", "daemon"])
def test_a_start_refused_by_a_second_driver_leaves_no_wal_or_shm(command, workdir, capsys, tiny_model):
    """`run` checks the file before it takes the lock; the daemon reads the storage's generations too."""
    _wal_study(workdir)
    db = workdir / "trials.db"
    before = _files(workdir)
    holder = RunState(f"sqlite:///{db}", workdir / "artifacts")
    holder.acquire()
    try:
        code, err = _cli(capsys, *command, "--config", "study.yaml", "--model", str(tiny_model),
                         "--study-name", "tune", "--storage", "sqlite:///trials.db")
        assert code == 2, err
        assert err == [f"error: storage sqlite:///{db} is in use by another driver (pid {os.getpid()} on "
                       f"{socket.gethostname()}); stop it first, or pass --storage with another database"]
        assert _sidecars(db) == []  # before the holder's release could close anything
    finally:
        holder.release()
    assert _files(workdir) == before


def test_releasing_the_driver_lock_closes_this_process_s_connections(tmp_path):
    db = tmp_path / "trials.db"
    url = f"sqlite:///{db}"
    state = RunState(url, tmp_path / "artifacts")
    state.acquire()
    study = optuna.create_study(study_name="s", storage=open_storage(url))
    study.enqueue_trial({"x": 1})
    assert _sidecars(db) == ["trials.db-shm", "trials.db-wal"]  # the driver's WAL, while it runs
    state.release()
    assert _sidecars(db) == []
    assert len(study.trials) == 1  # the storage stays usable after its connections closed


# --- a real read-only mount (a private mount namespace; skipped where it cannot be made) ----------

RO_SCRIPT = """set -e
mount --bind "$1" "$2"
mount -o remount,bind,ro "$2"
shift 2
cd "$WORKDIR"
exec "$@"
"""


def _on_a_read_only_mount(src: Path, mnt: Path, workdir: Path, *argv: str) -> subprocess.CompletedProcess:
    """`python -m optimizer ARGV` with `src` mounted read-only at `mnt`, in a mount namespace of its own
    (the mount goes with the process)."""
    env = {**os.environ, "WORKDIR": str(workdir), "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(["unshare", "-m", "sh", "-c", RO_SCRIPT, "ro", str(src), str(mnt),
                           sys.executable, "-m", "optimizer", *argv], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.fixture
def ro_mount(workdir):
    """(src, mnt): a directory and where a test's command sees it read-only; skipped if no mount can be made."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) on this machine")
    src, mnt = workdir / "src", workdir / "ro"
    src.mkdir()
    mnt.mkdir()
    probe = subprocess.run(["unshare", "-m", "sh", "-c", RO_SCRIPT, "ro", str(src), str(mnt), "sh", "-c",
                            f"! touch {mnt}/probe 2>/dev/null"], env={**os.environ, "WORKDIR": str(workdir)},
                           capture_output=True, timeout=30, check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a read-only mount here ({probe.stderr.decode().strip()[:100]})")
    return src, mnt


def test_on_a_read_only_mount_run_is_one_line_and_report_reads_a_rollback_journal_study(ro_mount, workdir,
                                                                                     tiny_model):
    src, mnt = ro_mount
    _stored_study(src / "trials.db")
    before = _sha(src / "trials.db")
    flags = ["--config", str(workdir / "study.yaml"), "--model", str(tiny_model), "--study-name", "tune",
             "--storage", f"sqlite:///{mnt}/trials.db", "--artifacts-dir", str(workdir / "artifacts")]
    ran = _on_a_read_only_mount(src, mnt, workdir, "run", *flags)
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.splitlines() == [f"error: storage sqlite:///{mnt}/trials.db: cannot create its lock file "
                                       f"{mnt}/trials.db.lock (Read-only file system); pass --storage with a "
                                       "writable directory"]
    reported = _on_a_read_only_mount(src, mnt, workdir, "report", *flags)
    assert reported.returncode == 0, reported.stderr
    assert "): trial 1, " in reported.stdout  # "Recommended (<source>): trial 1, ..."
    assert _sha(src / "trials.db") == before and sorted(p.name for p in src.iterdir()) == ["trials.db"]


def test_a_wal_study_on_a_read_only_mount_is_one_line(ro_mount, workdir, tiny_model):
    src, mnt = ro_mount
    _wal_study(src)
    before = _files(src)
    reported = _on_a_read_only_mount(src, mnt, workdir, "report", "--config", "study.yaml", "--model",
                                     str(tiny_model), "--study-name", "tune", "--storage", "sqlite:///ro/trials.db")
    assert reported.returncode == 2, reported.stderr
    assert [line.replace(str(workdir), "<dir>") for line in reported.stderr.splitlines()] == [f"error: {WAL_RO}"]
    assert _files(src) == before


WAL_RO = ("storage <dir>/ro/trials.db cannot be read (unable to open database file): <dir>/ro takes no writes, and "
          "a WAL-mode database needs them (for its -shm file); copy it to a writable directory and pass --storage "
          "with the copy")


def test_the_docs_list_these_lines_word_for_word():
    text = TROUBLESHOOTING.read_text()
    lines = [LOCK_LINE.format(d=NO_FILES_HERE),
             "storage <dir>/afile/trials.db: <dir>/afile is a file, not a directory; pass --storage with a path in a "
             "directory",
             WAL_RO]
    missing = [line for line in lines if f"`` error: {line} ``" not in text]
    assert not missing, f"docs/troubleshooting.md lacks (or words differently): {missing}"
