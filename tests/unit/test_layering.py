"""The package boundaries, checked by reading the source (AST), not by convention.

- Only ``cluster/`` runs Slurm commands: no argv literal starting with a Slurm binary, and no
  shell string running one, in ``jobs/``, ``train/`` or ``bench/`` (the benchmarks' own plain
  ``sbatch``/``sacct`` baselines are listed below, one by one). ``shlex.join([...])`` writes
  text (the script's srun line), not a command run here.
- Only ``cluster/local/`` knows the dev cluster: nothing outside ``cluster/`` (tests aside)
  imports ``cluster.local``, and inside ``cluster/`` only the dev cluster's own command line.
- ``jobs`` never imports torch; ``train`` never imports ``jobs``.
- Packages are layers: no loop among packages (every module folded into its package, the
  ``cycles.py --depth 2`` view), lazy imports included; an import from outside a package of
  ``train/`` goes through its face (``train/X/__init__.py``), never into its modules; a face is
  the only one (no other module re-exports, or has a module ``__getattr__``). The same for
  ``cluster/``: ``jobs/`` and ``train/`` import ``cluster`` (its ``__init__``), never
  ``cluster.client``/``cluster.models``/...; and ``jobs/`` uses ``train/`` through the faces of
  its torch-free layers only (``JOBS_USES_OF_TRAIN``). ``bench/`` and the tests may reach into
  any module (they measure and test modules, not the interface).
- Only the factory builds a Slurm client (``cluster.slurm_client``, in ``cluster/slurm.py``): no
  ``SlurmClient(...)`` anywhere else in the packages or the benchmarks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SLURM_BINARIES = frozenset(
    {"sbatch", "srun", "salloc", "scancel", "squeue", "sacct", "sinfo", "scontrol", "sacctmgr"}
)
SHELL_CALLS = frozenset({"system", "popen", "getoutput", "getstatusoutput"})
# (file, binary): a benchmark's baseline is the plain Slurm command, by definition.
BASELINES = {
    ("bench/cli_figures.py", "sbatch"),  # jobs submit vs a plain sbatch of the same script
    ("bench/cli_figures.py", "sacct"),  # jobs status vs one plain sacct of the same array
}
# ``python -m cluster up|down|status`` is the dev cluster's own command line.
LOCAL_CLUSTER_USERS = {"cluster/cli.py"}


def _sources(*packages: str) -> Iterator[tuple[str, ast.Module]]:
    for package in packages:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            yield rel, ast.parse(path.read_text(encoding="utf-8"), filename=rel)


def _imports(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Every module an import statement names (at any depth: lazy imports count too)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


_CMD_NAMES = frozenset({"cmd", "command", "argv", "args"})


def _argv(node: ast.AST | None) -> str | None:
    """The Slurm binary an argv literal ``["sbatch", ...]`` starts with, if it does."""
    if isinstance(node, ast.List | ast.Tuple) and node.elts:
        first = node.elts[0]
        if isinstance(first, ast.Constant) and first.value in SLURM_BINARIES:
            return str(first.value)
    return None


def _slurm_commands(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Argv literals given to a call (``run(["sbatch", ...])``) or kept as a command
    (``cmd = ["sacct", ...]``), and shell strings (``os.system("squeue ...")``). A tuple of
    names that is neither (``COMMANDS = ("squeue", ...)`` for shims) is not a command."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id.lower() for t in targets if isinstance(t, ast.Name)]
            binary = _argv(node.value)
            if binary and any(n in _CMD_NAMES or n.endswith(("_cmd", "_argv")) for n in names):
                yield node.lineno, binary
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            binary = _argv(node.args[0]) if node.args else None
            if binary and not _renders_text(func):
                yield node.lineno, binary
            shell = name in SHELL_CALLS or any(
                kw.arg == "shell" and isinstance(kw.value, ast.Constant) and kw.value.value
                for kw in node.keywords
            )
            if shell and node.args and isinstance(node.args[0], ast.Constant):
                word = str(node.args[0].value).split(maxsplit=1)[:1]
                if word and word[0] in SLURM_BINARIES:
                    yield node.lineno, word[0]


def _renders_text(func: ast.expr) -> bool:
    """``shlex.join([...])`` writes a line of a script (the srun line sbatch will run), it runs
    nothing here."""
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "join"
        and isinstance(func.value, ast.Name)
        and func.value.id == "shlex"
    )


def _is(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_only_cluster_runs_slurm_commands() -> None:
    found = [
        f"{rel}:{line}: runs {binary} (go through cluster.client.SlurmClient)"
        for rel, tree in _sources("jobs", "train", "bench")
        for line, binary in _slurm_commands(tree)
        if (rel, binary) not in BASELINES
    ]
    assert found == []


def test_the_scan_sees_slurm_commands() -> None:
    """The scanner itself: it must find what it is meant to forbid."""
    code = (
        "import os, subprocess\n"
        "subprocess.run(['sbatch', 'x.sh'])\n"
        "subprocess.Popen(('squeue', '-h'))\n"
        "os.system('scancel 12')\n"
        "subprocess.run('sinfo -h', shell=True)\n"
        "cmd = ['sacct', '-j', '1']\n"
        "subprocess.run(['echo', 'sbatch'])\n"
        "NAMES = ('squeue', 'sacct')\n"
        "line = shlex.join(['srun', '--unbuffered'])\n"  # a script's line, not run here
    )
    assert sorted(b for _, b in _slurm_commands(ast.parse(code))) == [
        "sacct",
        "sbatch",
        "scancel",
        "sinfo",
        "squeue",
    ]
    assert {b for rel, tree in _sources("bench") for _, b in _slurm_commands(tree)} >= {
        b for _, b in BASELINES
    }, "a listed baseline is gone: remove it from BASELINES"


def test_only_cluster_local_knows_the_dev_cluster() -> None:
    found = []
    for rel, tree in _sources("jobs", "train", "bench", "cluster"):
        if rel.startswith("cluster/local/") or rel in LOCAL_CLUSTER_USERS:
            continue
        found += [
            f"{rel}:{line}: imports {mod}"
            for line, mod in _imports(tree)
            if _is(mod, "cluster.local")
        ]
    assert found == []


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [("jobs", "torch"), ("train", "jobs"), ("cluster", "jobs"), ("cluster", "train")],
)
def test_package_never_imports(package: str, forbidden: str) -> None:
    found = [
        f"{rel}:{line}: imports {mod}"
        for rel, tree in _sources(package)
        for line, mod in _imports(tree)
        if _is(mod, forbidden)
    ]
    assert found == []


def _module_graph(*packages: str) -> dict[str, set[str]]:
    """module -> the project modules it imports (lazy imports too; a submodule importing its own
    package's ``__init__`` is not an edge: the package is importing itself)."""
    names = {}
    for rel, tree in _sources(*packages):
        parts = rel.removesuffix(".py").split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = tree

    def resolve(name: str) -> str | None:
        while name and name not in names:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in names}
    for module, tree in names.items():
        for _, imported in _imports(tree):
            target = resolve(imported)
            if target and target != module and not module.startswith(target + "."):
                graph[module].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    """Issue 24: no module of cluster/, jobs/ or train/ imports itself through others, lazy
    imports included (a cycle hides as a function-level import until it breaks a start-up)."""
    assert _cycles(_module_graph("cluster", "jobs", "train")) == []


def test_the_cycle_finder_finds_one() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _fold(graph: dict[str, set[str]], depth: int = 2) -> dict[str, set[str]]:
    """The graph of packages: each module folded into its first ``depth`` name parts."""

    def fold(m: str) -> str:
        return ".".join(m.split(".")[:depth])

    folded: dict[str, set[str]] = {}
    for module, targets in graph.items():
        folded.setdefault(fold(module), set()).update(
            fold(t) for t in targets if fold(t) != fold(module)
        )
    return folded


def test_no_package_cycles() -> None:
    """Issue 41: packages are layers. Folded into packages (train.stop.act -> train.stop),
    nothing imports itself back through others, lazy imports included."""
    assert _cycles(_fold(_module_graph("cluster", "jobs", "train"))) == []


def test_the_fold_finds_a_package_loop() -> None:
    graph = {"t.a.x": {"t.b.y"}, "t.b.y": set(), "t.b.z": {"t.a.w"}, "t.a.w": set()}
    assert _cycles(_fold(graph)) == [["t.a", "t.b"]]


def _faces() -> dict[str, set[str]]:
    """Each package whose face is its ``__init__`` -> its modules' names: ``cluster`` (to
    ``jobs/`` and ``train/``) and each package of ``train/``."""
    packages = [REPO / "cluster", *(init.parent for init in (REPO / "train").glob("*/__init__.py"))]
    return {
        ".".join(p.relative_to(REPO).parts): {c.stem for c in p.iterdir() if c.suffix == ".py"}
        | {c.name for c in p.iterdir() if (c / "__init__.py").is_file()}
        for p in packages
    }


def _package_of(module: str, faces: dict[str, set[str]]) -> str | None:
    return max((p for p in faces if _is(module, p)), key=len, default=None)


def _behind_faces(rel: str, tree: ast.Module, faces: dict[str, set[str]]) -> Iterator[str]:
    """Imports in ``rel`` that reach into another package (``cluster``, a package of ``train/``)
    past its face."""
    parts = rel.removesuffix(".py").removesuffix("/__init__").split("/")
    mine = _package_of(".".join(parts), faces)
    for node in ast.walk(tree):
        names: list[tuple[str, str | None]]
        if isinstance(node, ast.Import):
            names = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [(node.module, a.name) for a in node.names]
        else:
            continue
        for module, name in names:
            package = _package_of(module, faces)
            if package is None or package == mine:
                continue
            if module != package:
                yield f"{rel}:{node.lineno}: imports {module} (use the face, {package})"
            elif name in faces[package]:
                yield f"{rel}:{node.lineno}: imports the module {package}.{name} (use the face)"


def test_cross_package_imports_go_through_faces() -> None:
    """Issue 41: from outside a package (``cluster``, a package of ``train/``; in ``cluster/``,
    ``train/`` and ``jobs/``) only its face is imported: ``from train.stop import decide``,
    never ``train.stop.decision``; ``from cluster import JobInfo``, never ``cluster.models``."""
    faces = _faces()
    found = [
        line
        for rel, tree in _sources("cluster", "train", "jobs")
        for line in _behind_faces(rel, tree, faces)
    ]
    assert found == []


# What ``jobs/`` may use of ``train/``: the faces of its torch-free layers (a top-level module of
# ``train/`` is a layer, and its own face). ``train.cli`` is the hand-over inside the allocation.
JOBS_USES_OF_TRAIN = frozenset(
    {
        "train.command",
        "train.env",
        "train.errors",
        "train.history",
        "train.report",
        "train.runfiles",
        "train.safepath",
        "train.schema",
        "train.spec",
        "train.startup",
        "train.stop",
    }
)
HAND_OVER = {("jobs/launch.py", "train.cli")}


def _train_uses(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """The modules of ``train`` an import names (``from train import runfiles`` names
    ``train.runfiles``; ``from train.stop import decide`` names ``train.stop``)."""
    modules = {
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for p in (REPO / "train").rglob("*.py")
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                for a in node.names
            ]
        else:
            continue
        yield from ((node.lineno, n) for n in names if _is(n, "train"))


def test_jobs_uses_train_through_its_torch_free_faces() -> None:
    """Issue 41: ``jobs/`` imports of ``train/`` only the faces in ``JOBS_USES_OF_TRAIN``."""
    found = [
        f"{rel}:{line}: imports {module} (not a face jobs/ uses: {sorted(JOBS_USES_OF_TRAIN)})"
        for rel, tree in _sources("jobs")
        for line, module in _train_uses(tree)
        if module not in JOBS_USES_OF_TRAIN and (rel, module) not in HAND_OVER
    ]
    assert found == []


def test_the_train_scan_sees_a_module_behind_a_face() -> None:
    code = (
        "from train.runfiles import atomic_write\n"  # a face: fine
        "from train import runfiles\n"  # the same
        "from train.loop import run_training\n"
        "import train.stop.decision\n"
    )
    found = [m for _, m in _train_uses(ast.parse(code)) if m not in JOBS_USES_OF_TRAIN]
    assert found == ["train.loop", "train.stop.decision"]


def test_the_face_scan_sees_a_way_around_a_face() -> None:
    faces = {"train.stop": {"act", "decision"}, "train.hang": {"watcher"}}
    code = (
        "from train.stop.act import record\n"
        "import train.stop.decision\n"
        "from train.stop import act\n"
        "from train.stop import decide\n"  # the face: fine
        "from train.hang.watcher import main\n"  # its own package: fine
        "from cluster.models import JobInfo\n"
        "from cluster import JobInfo\n"  # the face: fine
    )
    faces |= {"cluster": {"models", "client"}}
    found = list(_behind_faces("train/hang/x.py", ast.parse(code), faces))
    assert [line.split(":")[1] for line in found] == ["1", "2", "3", "6"]


def _defined(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _all(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return [str(v) for v in ast.literal_eval(node.value)]
    return []


def test_one_face_per_package() -> None:
    """Issue 41: only a package's ``__init__`` is its face. No other module of ``train/`` has a
    module ``__getattr__`` or lists in ``__all__`` a name it does not define (a re-export:
    ``train/checkpoint/manager.py`` was a second face of ``train.checkpoint``)."""
    found = []
    for rel, tree in _sources("train"):
        if rel.endswith("__init__.py") or rel == "train/_lazy.py":
            continue
        defined = _defined(tree)
        if "__getattr__" in defined:
            found.append(f"{rel}: a module __getattr__ (a second face)")
        found += [f"{rel}: re-exports {name}" for name in _all(tree) if name not in defined]
    assert found == []


def _built_clients(tree: ast.Module) -> Iterator[int]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "SlurmClient":
                yield node.lineno


def test_only_the_factory_builds_a_slurm_client() -> None:
    """Issue 41: one factory builds the Slurm client (``cluster.slurm_client``: where a later
    transport plugs in); nothing else calls ``SlurmClient(...)``."""
    found = [
        f"{rel}:{line}: builds SlurmClient(...) by hand (use cluster.slurm_client)"
        for rel, tree in _sources("cluster", "jobs", "train", "bench")
        if rel != "cluster/slurm.py"  # the factory
        for line in _built_clients(tree)
    ]
    assert found == []
