"""driver/store/database.py: never overwrite a file that is not ours; WAL on; SQLite paths made absolute."""

import sqlite3

import optuna
import pytest

from optimizer.driver.store.database import normalize_url, open_storage, sqlite_path
from optimizer.errors import StorageError


def test_garbage_file_is_refused_and_left_untouched(tmp_path):
    db = tmp_path / "trials.db"
    db.write_bytes(b"\x00\x13garbage, not a database\xff" * 40)
    before = db.read_bytes()
    with pytest.raises(StorageError, match="not a SQLite database"):
        open_storage(f"sqlite:///{db}")
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trials.db"]


def test_foreign_sqlite_database_is_refused_and_left_untouched(tmp_path):
    db = tmp_path / "trials.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
        con.execute("INSERT INTO invoices VALUES (1, 9.5)")
    con.close()
    before = db.read_bytes()
    with pytest.raises(StorageError, match="not an Optuna one"):
        open_storage(f"sqlite:///{db}")
    assert db.read_bytes() == before


def test_fresh_path_opens_in_wal_mode_and_reopens(tmp_path):
    db = tmp_path / "trials.db"
    storage = open_storage(f"sqlite:///{db}")
    assert isinstance(storage, optuna.storages.RDBStorage)
    study = optuna.create_study(study_name="s", storage=storage)
    study.enqueue_trial({"x": 1})
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.close()
    again = optuna.load_study(study_name="s", storage=open_storage(f"sqlite:///{db}"))
    assert len(again.trials) == 1


def test_relative_sqlite_url_becomes_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert normalize_url("sqlite:///trials.db") == f"sqlite:///{tmp_path.resolve() / 'trials.db'}"
    assert normalize_url("sqlite:///sub/../t.db") == f"sqlite:///{tmp_path.resolve() / 't.db'}"


def test_other_urls_are_left_alone():
    url = "postgresql+psycopg2://u:p@db:5432/optuna"
    assert normalize_url(url) == url
    assert sqlite_path("sqlite://") is None and sqlite_path("sqlite:///:memory:") is None
    with pytest.raises(StorageError, match="not a database URL"):
        sqlite_path("trials.db")


def test_missing_directory_is_refused(tmp_path):
    with pytest.raises(StorageError, match="does not exist"):
        open_storage(f"sqlite:///{tmp_path}/no/such/dir/trials.db")
    assert list(tmp_path.iterdir()) == []


def test_directory_given_as_the_database_is_a_storage_error(tmp_path):
    (tmp_path / "studies").mkdir()
    with pytest.raises(StorageError):
        open_storage(f"sqlite:///{tmp_path / 'studies'}")


def test_a_ray_job_takes_an_absolute_sqlite_path_or_a_server_url_but_not_a_relative_path(tmp_path):
    from optimizer.driver.store.database import normalize_url
    from optimizer.errors import StorageError

    assert normalize_url(f"sqlite:///{tmp_path}/t.db", in_job=True) == f"sqlite:///{tmp_path}/t.db"
    assert normalize_url("postgresql://u:p@h/db", in_job=True) == "postgresql://u:p@h/db"
    with pytest.raises(StorageError, match="relative SQLite path"):
        normalize_url("sqlite:///trials.db", in_job=True)
    assert normalize_url("sqlite:///trials.db").startswith("sqlite:////")  # outside a job: made absolute


def test_a_url_is_shown_without_its_password():
    from optimizer.driver.store.database import masked

    assert masked("postgresql://tuner:s3cret@db:5432/optuna") == "postgresql://tuner:***@db:5432/optuna"
    assert masked("sqlite:////data/trials.db") == "sqlite:////data/trials.db"


@pytest.mark.parametrize("said, expected", [
    ('connection failed: connection to server at "db", port 5432 failed: FATAL:  password authentication failed '
     'for user "tuner"', "refused the login (password authentication failed for user \"tuner\"); check the user "
     "name and password in the URL"),
    ("(1045, \"Access denied for user 'tuner'@'10.0.0.2' (using password: YES)\")",
     "refused the login (Access denied for user 'tuner'@'10.0.0.2' (using password: YES)\")); check the user"),
    ('connection failed: connection to server at "db", port 5432 failed: FATAL:  database "optuna" does not exist',
     "is unreachable (connection failed"),
])
def test_a_server_that_refuses_the_login_is_told_apart_from_one_that_does_not_answer(monkeypatch, said, expected):
    """A wrong password is not "unreachable" (the server answered); the password is never shown.
    (The real server's line: tests/integration/test_postgres_storage.py.)"""
    from sqlalchemy.exc import OperationalError

    from optimizer.driver.store import database as storage

    class Refusing:
        def connect(self):
            raise OperationalError("connect", {}, Exception(said))

        def dispose(self):
            pass

    monkeypatch.setattr(storage, "create_engine", lambda url, connect_args: Refusing())
    with pytest.raises(StorageError) as err:
        storage.check_storage("postgresql://tuner:s3cret@db:5432/optuna")
    assert str(err.value).startswith(f"storage 'postgresql://tuner:***@db:5432/optuna' {expected}")
    assert "s3cret" not in str(err.value)
