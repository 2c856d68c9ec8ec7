"""The layer rules of docs/architecture.md, checked on every package's imports (AST), and what importing the
light entry points pulls into ``sys.modules``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

# The product's packages, lowest first; package -> the fractune packages it may import (itself included): the one
# direction of docs/architecture.md. ``results`` (sweeps read back from MLflow) lies below both ``dashboards``
# (the views) and ``orchestrator`` (the CLI, the sweep driver, tracking, cluster jobs), and imports neither.
PACKAGES = ("engine", "search_spaces", "trainables", "results", "dashboards", "orchestrator")
MAY_IMPORT = {
    "engine": {"engine"},
    "search_spaces": {"engine", "search_spaces"},
    "trainables": {"engine", "search_spaces", "trainables"},
    "results": {"engine", "search_spaces", "results"},
    "dashboards": {"engine", "search_spaces", "results", "dashboards"},
    "orchestrator": set(PACKAGES),
}
SERVICE_LIBRARIES = {"ray", "mlflow", "optuna"}
MAY_USE_SERVICES = {  # package -> the service libraries it may import
    "engine": set(), "search_spaces": set(), "trainables": {"ray"}, "results": {"mlflow", "optuna"},
    "dashboards": {"mlflow", "optuna"}, "orchestrator": SERVICE_LIBRARIES,
}
# orchestrator's subpackages, lowest first: a module imports only from its own layer or below (api.py and its
# private helpers form one layer; the CLI's commands call the API)
ORCHESTRATOR_LAYERS = (
    {"orchestrator.tracking", "orchestrator.cluster"},
    {"orchestrator.sweep"},
    {"orchestrator.api", "orchestrator._preflight", "orchestrator._reports", "orchestrator._inputs",
     "orchestrator._result_types", "orchestrator._data_parallel", "orchestrator._interrupts"},
    {"orchestrator.cli"},
)
# orchestrator modules that import Ray at module level: the Tune callbacks, imported lazily by the sweep driver
RAY_AT_IMPORT = {"orchestrator.tracking.tracker", "orchestrator.sweep.progress_lines",
                 "orchestrator.sweep.tune_checkpoints"}


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported module, at module level) for every import statement; ``from pkg import sub`` counts as
    ``pkg.sub`` when ``sub`` is a module of a fractune package."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(node) for node in tree.body}
    for node in tree.body:  # module-level try/if blocks still run at import
        if isinstance(node, ast.Try | ast.If):
            top |= {id(n) for n in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}: relative import"
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                is_module = (ROOT / Path(*sub.split("."))).with_suffix(".py").is_file()
                out.append((sub if is_module else node.module, id(node) in top))
    return out


SOURCES = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))
IMPORTS = {_module(p): _imports(p) for p in SOURCES}


def _violations(rule) -> list[str]:
    return [f"{mod} imports {name}" + ("" if top else " (in a function)")
            for mod, imports in IMPORTS.items() for name, top in imports if rule(mod, name, top)]


def test_every_package_is_scanned():
    assert {m.split(".")[0] for m in IMPORTS} == set(PACKAGES) and len(IMPORTS) > 40


def test_fractune_packages_import_only_downwards():
    def wrong(mod, name, top):
        pkg, target = mod.split(".")[0], name.split(".")[0]
        return target in PACKAGES and target not in MAY_IMPORT[pkg]

    assert _violations(wrong) == []


def test_service_libraries_only_where_allowed():
    def wrong(mod, name, top):
        lib = name.split(".")[0]
        return lib in SERVICE_LIBRARIES and lib not in MAY_USE_SERVICES[mod.split(".")[0]]

    assert _violations(wrong) == []


RAY_TRAIN_MODULES = {"trainables.data_parallel"}  # data-parallel runs: Ray Train's TorchTrainer and its workers


def test_only_ray_tune_apis_never_ray_train_or_air():
    # Ray Train V2 turned ray.train.report/RunConfig inside Tune into hard errors (ecosystem.md, pitfall 7): Tune
    # code uses ray.tune only; ray.train lives in the one module that runs data-parallel workers
    assert _violations(lambda mod, name, top: name.split(".")[:2] == ["ray", "air"] or (
        name.split(".")[:2] == ["ray", "train"] and mod not in RAY_TRAIN_MODULES)) == []


def test_results_and_dashboards_never_import_the_orchestrator():
    """The must-show of the layering: no import of ``orchestrator`` in ``results`` or ``dashboards``, none of
    ``dashboards`` in ``results`` (in a function or under TYPE_CHECKING alike)."""
    def wrong(mod, name, top):
        pkg, target = mod.split(".")[0], name.split(".")[0]
        return (pkg in ("results", "dashboards") and target == "orchestrator") or \
            (pkg == "results" and target == "dashboards")

    assert _violations(wrong) == []


def orchestrator_layer(module: str) -> int | None:
    parts = module.split(".")
    for depth in (2, 1):
        name = ".".join(parts[:depth])
        for level, members in enumerate(ORCHESTRATOR_LAYERS):
            if name in members:
                return level
    return None


def test_every_orchestrator_module_has_a_layer():
    assert [m for m in IMPORTS if m.startswith("orchestrator.") and orchestrator_layer(m) is None] == []
    loose = sorted(p.name for p in (ROOT / "orchestrator").glob("*.py"))
    assert loose == ["__init__.py", "_data_parallel.py", "_inputs.py", "_interrupts.py", "_preflight.py",
                     "_reports.py", "_result_types.py", "api.py"]


def orchestrator_upward_imports(imports) -> list[str]:
    out = []
    for mod, names in imports.items():
        here = orchestrator_layer(mod)
        for name, top in names:
            there = orchestrator_layer(name)
            if here is not None and there is not None and there > here:
                out.append(f"{mod} imports {name}" + ("" if top else " (in a function)"))
    return out


def test_orchestrator_imports_only_its_own_layer_or_below():
    assert orchestrator_upward_imports(IMPORTS) == []


def test_the_orchestrator_layer_check_finds_an_upward_import():
    bad = {**IMPORTS, "orchestrator.tracking.tracker": [("orchestrator.api", False)]}
    assert orchestrator_upward_imports(bad) == ["orchestrator.tracking.tracker imports orchestrator.api (in a function)"]


def test_orchestrator_imports_ray_lazily():
    def wrong(mod, name, top):
        return mod.startswith("orchestrator") and top and name.split(".")[0] == "ray" and mod not in RAY_AT_IMPORT

    assert _violations(wrong) == []
    # and nothing imports those callbacks at module level
    assert _violations(lambda mod, name, top: top and name in RAY_AT_IMPORT) == []


@pytest.mark.parametrize("rule", [test_fractune_packages_import_only_downwards,
                                  test_service_libraries_only_where_allowed])
def test_the_scan_catches_a_violation(rule, monkeypatch):
    bad = {**IMPORTS, "engine.bad": [("orchestrator.sweep.driver", True), ("ray.tune", True)]}
    monkeypatch.setitem(globals(), "IMPORTS", bad)
    with pytest.raises(AssertionError):
        rule()


def _loaded_after(import_stmt: str, forbidden: tuple[str, ...]) -> list[str]:
    code = f"import sys; {import_stmt}; print(','.join(m for m in {forbidden!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    return [m for m in out.stdout.strip().split(",") if m]


@pytest.mark.slow
def test_light_entry_points_import_no_service_libraries():
    # the engine, and `fractune train`/`cost` (in-process, engine only); and the read side (`pareto`, `report`,
    # `ui`, `results`) pays no Ray import
    stmt = ("import engine, engine.train, engine.config.experiment, engine.data.datasets, engine.cost.bitops, "
            "engine.models, engine.schedules.curves, engine.dfq.gated_runner, engine.preview, engine.checkpoint, "
            "search_spaces.spec, search_spaces.trial, orchestrator.cli, orchestrator.cli.commands_engine")
    assert _loaded_after(stmt, ("ray", "mlflow", "optuna")) == []
    stmt = ("import results.store, results.runs, results.ablation_analysis, "
            "orchestrator.cli.commands_ablate, orchestrator.cli.commands_sweep, dashboards.report, dashboards.ui, "
            "dashboards.data, dashboards.results_page")
    assert _loaded_after(stmt, ("ray",)) == []


@pytest.mark.slow
def test_reading_checking_and_driving_a_sweep_loads_no_torch():
    """torch loads in a trial's process only: the config and the spec, the data's checks, the sweep's driver and
    tracker, the read side, `fractune validate` of a spec or a config (preflight included) and a refused `fractune
    train` never import it, so a CLI process or a driver starts, or refuses, without its import cost."""
    stmt = ("import engine.config, engine.models, engine.data.files, engine.dfq.vocabulary, search_spaces.spec, "
            "search_spaces.trial, trainables.tune_trainable, orchestrator.api, orchestrator.sweep.launch, "
            "orchestrator.sweep.stages, orchestrator.tracking.tracker, results.pareto, dashboards.report, "
            "dashboards.results_page, contextlib, io; from orchestrator.cli.main import main; "
            "out = io.StringIO(); ctx = contextlib.redirect_stdout(out); ctx.__enter__(); "
            "code = main(['validate', 'search_spaces/demo.yaml', '--json']); "
            "code += main(['validate', 'examples/fmnist_dfq.yaml']); ctx.__exit__(None, None, None); "
            "assert code == 0, out.getvalue(); assert main(['train', 'examples/fmnist_dfq.yaml', '--set', "
            "'optim.epochs=0']) == 2")
    assert _loaded_after(stmt, ("torch",)) == []
    # and the zoo itself still loads on first use
    assert _loaded_after("from engine.models import build_model", ("torch",)) == ["torch"]


def _type_only(path: Path) -> set[str]:
    """The modules a file imports only under ``if TYPE_CHECKING:`` (for annotations; never at run time)."""
    tree = ast.parse(path.read_text(), str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and inner.module:
                    out |= {inner.module} | {f"{inner.module}.{a.name}" for a in inner.names}
    return out


def import_cycles(imports: dict[str, list[tuple[str, bool]]]) -> list[list[str]]:
    """The groups of product modules that import each other, directly or through others (a strongly connected
    component of more than one module), at module level, inside functions and under ``if TYPE_CHECKING:`` alike."""
    graph = {m: {n for n, _ in names if n in imports and n != m}
             for m, names in imports.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


TYPE_ONLY = {_module(p): _type_only(p) for p in SOURCES}


def test_no_import_cycle_among_the_products_modules():
    """No two modules need each other, not even through a late import inside a function or one under
    ``if TYPE_CHECKING:``: each one can be read, tested and moved with what it imports below it."""
    assert import_cycles(IMPORTS) == []


def test_the_service_packages_have_no_cycle_even_type_only():
    service = {m: v for m, v in IMPORTS.items() if not m.startswith("engine")}
    assert import_cycles(service) == []


def test_the_cycle_check_finds_a_cycle():
    looped = {**IMPORTS, "engine.numerics.quant": [*IMPORTS["engine.numerics.quant"], ("engine.train", False)]}
    assert {"engine.numerics.quant", "engine.train"} <= set(sum(import_cycles(looped), []))


# engine/'s layers, lowest first: a module imports only from its own layer or below (docs/architecture.md)
ENGINE_LAYERS = (
    {"engine.errors", "engine.safe_yaml", "engine.metrics", "engine.run_length", "engine.distributed",
     "engine.optim"},
    {"engine.numerics"},
    {"engine.models"},
    {"engine.cost"},
    {"engine.data"},
    {"engine.schedules"},
    {"engine.dfq"},
    {"engine.config"},
    {"engine.train", "engine.run_metrics", "engine.checkpoint", "engine.preview", "engine.reach", "engine"},
)


def engine_layer(module: str) -> int | None:
    parts = module.split(".")
    for depth in (2, 1):
        name = ".".join(parts[:depth])
        for level, members in enumerate(ENGINE_LAYERS):
            if name in members:
                return level
    return None


def engine_upward_imports(imports, type_only) -> list[str]:
    out = []
    for mod, names in imports.items():
        here = engine_layer(mod) if mod.startswith("engine") else None
        for name, top in names:
            there = engine_layer(name) if name.split(".")[0] == "engine" else None
            if here is None or there is None or name in type_only.get(mod, set()):
                continue
            if there > here:
                out.append(f"{mod} imports {name}" + ("" if top else " (in a function)"))
    return out


def test_every_engine_module_has_a_layer():
    assert [m for m in IMPORTS if m.startswith("engine") and engine_layer(m) is None] == []
    # the package holds subpackages by concept, few modules loose at its top
    loose = sorted(p.name for p in (ROOT / "engine").glob("*.py"))
    assert loose == ["__init__.py", "checkpoint.py", "distributed.py", "errors.py", "metrics.py", "optim.py", "preview.py",
                     "reach.py", "run_length.py", "run_metrics.py", "safe_yaml.py", "train.py"]


def test_engine_imports_only_its_own_layer_or_below():
    assert engine_upward_imports(IMPORTS, TYPE_ONLY) == []


def test_the_layer_check_finds_an_upward_import():
    bad = {**IMPORTS, "engine.numerics.quant": [("engine.dfq.gate", False)]}
    assert engine_upward_imports(bad, TYPE_ONLY) == ["engine.numerics.quant imports engine.dfq.gate (in a function)"]
