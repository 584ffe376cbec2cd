"""The layout docs/architecture.md describes, held against the code's own imports: no import
circles (lazy imports inside functions count), the packages that may import optuna, ray and
aiohttp, report/ imported only by the commands, measure/ independent of engine/, no module past
400 lines, each package saying what it holds, and one owner (record/) of what a study stores."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "optimizer"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.add(sub if sub in MODULES else node.module)
    return found


def _package(module: str) -> str:
    """optimizer.driver.store.database -> driver; optimizer.errors -> errors."""
    return module.split(".")[1] if module.count(".") else ""


def test_no_module_imports_itself_back():
    graph = {m: {t for t in _imports(p) if t in MODULES and t != m} for m, p in MODULES.items()}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(m: str, path: list[str]) -> bool:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycle.extend(path[path.index(t):] + [t] if t in path else [m, t])
                return True
            if t not in state and visit(t, path + [t]):
                return True
        state[m] = 2
        return False

    assert not any(visit(m, [m]) for m in sorted(graph) if m not in state), " -> ".join(cycle)


def test_packages_import_each_other_one_way():
    deps: dict[str, set[str]] = {}
    for m, p in MODULES.items():
        for t in _imports(p):
            if t.startswith("optimizer.") and _package(t) != _package(m):
                deps.setdefault(_package(m), set()).add(_package(t))
    both = sorted((a, b) for a in deps for b in deps[a] if a < b and a in deps.get(b, set()))
    assert not both, f"packages importing each other: {both}"
    assert not any("cli" in targets for pkg, targets in deps.items() if pkg not in ("cli", "__main__")), "nothing imports cli/ but __main__"


@pytest.mark.parametrize("library, allowed", [("optuna", {"driver", "report", "verdict", "search"}), ("ray", {"driver", "trial"}),
                                              ("aiohttp", {"measure", "engine", "daemon"})])
def test_only_some_packages_import(library, allowed):
    users = {m for m, p in MODULES.items() if any(i == library or i.startswith(library + ".") for i in _imports(p))}
    assert {_package(m) for m in users} <= allowed, sorted(m for m in users if _package(m) not in allowed)


def test_what_a_study_says_imports_none_of_its_readers():
    """verdict/ is read by driver/, daemon/ and report/ (and cli/); it imports none of them."""
    users = {_package(m) for m, p in MODULES.items() if any(_package(t) == "verdict" for t in _imports(p)
                                                            if t.startswith("optimizer."))} - {"verdict"}
    assert {"driver", "daemon", "report"} <= users
    imported = {_package(t) for m, p in MODULES.items() if _package(m) == "verdict"
                for t in _imports(p) if t.startswith("optimizer.")}
    assert not imported & {"driver", "daemon", "report", "trial", "cli"}, sorted(imported)


# The packages that run, serve and judge a study; report/ presents what they decided, they never ask it.
NOT_PRESENTERS = ("driver", "daemon", "verdict", "measure", "search", "text", "deploy")


@pytest.mark.parametrize("package", NOT_PRESENTERS)
def test_only_the_commands_import_the_report(package):
    """report/ presents only: what the driver, the daemon and the verdicts need to say or deploy lives
    below it (text/, deploy/), and what they need of it is handed in by the command (cli/)."""
    found = sorted(f"{m} -> {t}" for m, p in MODULES.items() if _package(m) == package
                   for t in _imports(p) if t.startswith("optimizer.") and _package(t) == "report")
    assert not found, found


def test_the_report_is_the_commands_to_call():
    users = {_package(m) for m, p in MODULES.items() if any(_package(t) == "report" for t in _imports(p)
                                                            if t.startswith("optimizer."))}
    assert users <= {"report", "cli"}, sorted(users)


def test_who_decides_what_to_boot_next_sits_below_the_driver():
    """search/ is called by the driver (and the sensitivity command); it imports none of the packages
    that start, run or present trials."""
    imported = {_package(t) for m, p in MODULES.items() if _package(m) == "search"
                for t in _imports(p) if t.startswith("optimizer.")} - {"search"}
    assert not imported & {"driver", "daemon", "report", "trial", "engine", "cli"}, sorted(imported)
    users = {_package(m) for m, p in MODULES.items() if any(_package(t) == "search" for t in _imports(p)
                                                            if t.startswith("optimizer."))} - {"search"}
    assert "driver" in users, sorted(users)


def test_measuring_knows_no_server_process():
    """measure/ measures a replay; what a failure is (optimizer/failure.py) sits below both it and engine/."""
    found = sorted(f"{m} -> {t}" for m, p in MODULES.items() if _package(m) == "measure"
                   for t in _imports(p) if t.startswith("optimizer.") and _package(t) == "engine")
    assert not found, found


def test_modules_stay_small_and_packages_say_what_they_hold():
    long = sorted(f"{m} ({n} lines)" for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > 400)
    assert not long, long
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc.split()) >= 12, f"{init.relative_to(PACKAGE.parent)} says too little about what it holds"
        folder = init.parent
        assert len(list(folder.glob("*.py"))) <= 14, f"{folder.name}/ holds {len(list(folder.glob('*.py')))} modules"


# Optuna's names for what a study and its trials store (and its storage's calls that write them).
ATTRIBUTE_NAMES = frozenset({"user_attrs", "system_attrs", "set_user_attr", "set_system_attr",
                             "set_study_user_attr", "set_study_system_attr", "set_trial_user_attr",
                             "set_trial_system_attr", "get_study_user_attrs", "get_study_system_attrs"})


def _attribute_uses(path: Path) -> list[int]:
    """The lines of `path` that touch a study's or a trial's stored attributes: an attribute, a
    keyword argument (enqueue_trial(user_attrs=...)), a name or a string (getattr) of Optuna's."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        name = (node.attr if isinstance(node, ast.Attribute) else node.arg if isinstance(node, ast.keyword)
                else node.id if isinstance(node, ast.Name) else node.value if isinstance(node, ast.Constant) else None)
        if isinstance(name, str) and name in ATTRIBUTE_NAMES:
            lines.append(getattr(node, "lineno", 0) or 0)
    return sorted(lines)


def test_only_the_record_touches_what_a_study_stores():
    """Every key the tool stores on a study or a trial is named once, in record/, and read or written
    there through its accessors and writers: no other module touches Optuna's user or system attributes."""
    found = sorted(f"{m}:{n}" for m, p in MODULES.items() if _package(m) != "record" for n in _attribute_uses(p))
    assert not found, found
    assert any(_attribute_uses(p) for m, p in MODULES.items() if _package(m) == "record")  # the scan sees them


def test_the_record_sits_below_every_package_that_reads_a_study():
    """record/ imports nothing of the project but errors.py (so any package may import it), and no optuna."""
    imported = {t for m, p in MODULES.items() if _package(m) == "record" for t in _imports(p)
                if t.startswith("optimizer.") and _package(t) != "record"}
    assert imported <= {"optimizer.errors"}, sorted(imported)
    users = {_package(m) for m, p in MODULES.items() if any(_package(t) == "record" for t in _imports(p)
                                                            if t.startswith("optimizer."))} - {"record"}
    assert {"driver", "verdict", "report", "daemon", "outputs", "fleet", "whatif", "cli"} <= users, sorted(users)
