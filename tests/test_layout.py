"""The layout's rules, checked: dvc.yaml's code deps cannot drift, no import cycles, small modules.

Each stage lists exactly the `xdbert` modules its script runs: a module a stage imports (directly or through
other modules, lazily inside a function or not, package `__init__`s included) but does not list is a code
change that would silently not rerun the stage; a listed module it never imports reruns it for nothing.
"""
import graphlib
import re
from pathlib import Path

import pytest
import yaml

from xdbert.imports import PACKAGE, closure, imported_modules, module_file, package_modules

ROOT = Path(__file__).resolve().parents[1]
def stages() -> dict[str, dict]:
    text = (ROOT / "dvc.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)["stages"]


def code_deps(stage: dict) -> set[Path]:
    body = stage.get("do", stage)
    return {ROOT / d for d in body.get("deps", []) if d.endswith(".py") and not d.startswith("${")}


def script_of(stage: dict) -> Path:
    body = stage.get("do", stage)
    match = re.match(r"python (stages/\S+\.py)", body["cmd"])
    assert match, f"stage command {body['cmd']!r} does not run a stages/ script"
    return ROOT / match.group(1)


@pytest.mark.parametrize("name", sorted(stages()))
def test_stage_lists_exactly_the_modules_it_runs(name):
    stage = stages()[name]
    script = script_of(stage)
    assert script.name == f"{name}.py" or name in ("adapt_baseline", "ablate"), \
        f"stage {name} runs {script.name}: a stage's script is stages/<stage name>.py"
    needed, listed = closure(script), code_deps(stage)
    rel = lambda paths: sorted(str(p.relative_to(ROOT)) for p in paths)  # noqa: E731
    assert not needed - listed, f"dvc.yaml stage {name} misses deps it imports: {rel(needed - listed)} " \
                               f"(`python tools/dvc_yaml.py` writes them)"
    assert not listed - needed, f"dvc.yaml stage {name} lists modules it never imports: {rel(listed - needed)} " \
                               f"(`python tools/dvc_yaml.py` writes them)"


@pytest.mark.parametrize("name", sorted(stages()))
def test_a_stage_that_can_load_from_the_hub_depends_on_the_pins(name):
    """xdbert/hub.py resolves hub ids through hub.lock.json (`xdbert fetch`): new pins must rerun the stage."""
    stage = stages()[name]
    deps = stage.get("do", stage)["deps"]
    assert ((ROOT / "xdbert/hub.py") in closure(script_of(stage))) == ("hub.lock.json" in deps), name


@pytest.mark.parametrize("name", sorted(stages()))
def test_a_stage_depends_on_the_mkl_library_numerics_loads(name):
    """xdbert/mkl_dispatch.c decides which GEMM kernels MKL runs on an Intel CPU, so it decides bytes."""
    stage = stages()[name]
    runs_numerics = ROOT / "xdbert/numerics.py" in closure(script_of(stage))
    assert runs_numerics == ("xdbert/mkl_dispatch.c" in stage.get("do", stage)["deps"]), name


def test_the_check_sees_a_missing_dep(tmp_path):
    """The closure follows lazy imports inside functions, and imports made by imported modules."""
    script = tmp_path / "s.py"
    script.write_text("def main():\n    from xdbert import io\n")  # io imports xdbert.errors inside a function
    assert closure(script) == {script, *(ROOT / f"xdbert/{m}.py" for m in ("__init__", "numerics", "io", "errors"))}


def test_resource_deps_exist():
    for stage in stages().values():
        for dep in stage.get("do", stage).get("deps", []):
            if dep.startswith("xdbert/"):
                assert (ROOT / dep).exists(), f"dvc.yaml names {dep}, which does not exist"


def import_graph() -> dict[str, set[str]]:
    """Each package module -> the package modules it imports, lazy imports too, its own parent packages not."""
    graph = {}
    for name in package_modules():
        deps = imported_modules(module_file(name)) - {name}
        graph[name] = {d for d in deps if not name.startswith(d + ".")}
    return graph


def test_no_import_cycles():
    """Counting every import, lazy ones too; a package's `__init__` importing its own modules is no cycle."""
    graph = import_graph()
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")


# docs/architecture.md's tiers after the base, in order: (its name, the packages or top-level modules it holds, dotted
# under xdbert). The base is every other top-level module of the package (and `profiles`, its data).
TIERS = (("data", ("data",)), ("model", ("model",)), ("adaptation", ("adaptation",)),
         # `finetuning`'s own `__init__` runs with every compute module, so it is compute's
         ("finetuning.compute", ("finetuning", "finetuning.compute")), ("finetuning.control", ("finetuning.control",)),
         ("analysis", ("analysis",)), ("reports", ("reports",)),
         ("commands", ("cli", "params_check", "fetch", "fetch_check", "mirror", "mirror_probes", "rehearse")))


def tier(module: str) -> int:
    """0 for the base, i + 1 for the i-th of TIERS, the longest package that holds the module deciding:
    xdbert.io -> 0, xdbert.data.corpus -> 1, xdbert.finetuning.compute.loop -> 4, xdbert.finetuning.control.grid -> 5."""
    rel = module.removeprefix("xdbert").removeprefix(".")
    holders = [(len(name), i + 1) for i, (_, names) in enumerate(TIERS) for name in names
               if rel == name or rel.startswith(name + ".")]
    return max(holders)[1] if holders else 0


def tier_name(module: str) -> str:
    return TIERS[tier(module) - 1][0] if tier(module) else "base"


def later_tier_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a module from a later tier than its own, both named with their tiers."""
    return sorted(f"{m} ({tier_name(m)}) imports {d} ({tier_name(d)})"
                  for m, deps in graph.items() for d in deps if tier(d) > tier(m))


def test_no_module_imports_a_later_tier():
    """docs/architecture.md: a module imports from its own tier and the ones before it, lazily or not."""
    assert later_tier_imports(import_graph()) == []


def test_the_tiers_are_the_documented_order():
    assert [tier_name(f"xdbert.{p}.x") for p in ("io", "data", "model", "adaptation", "finetuning.compute",
                                                 "finetuning.control", "analysis", "reports", "rehearse")] == \
        ["base", *(name for name, _ in TIERS)]
    assert tier("xdbert") == tier("xdbert.random_encoder") == tier("xdbert.profiles") == 0
    assert tier("xdbert.finetuning") == tier("xdbert.finetuning.compute") == tier("xdbert.finetuning.compute.loop")
    # a module directly in finetuning/ would count as compute without being in compute/: each is in one or the other
    assert sorted(p.name for p in (ROOT / PACKAGE / "finetuning").glob("*.py")) == ["__init__.py"]


@pytest.mark.parametrize("edge, caught", [
    # the tokenizer's vocabulary once took `random:` from model/settings.py
    (("xdbert.data.tokenization.vocab", "xdbert.model.settings"),
     "xdbert.data.tokenization.vocab (data) imports xdbert.model.settings (model)"),
    (("xdbert.training", "xdbert.cli"), "xdbert.training (base) imports xdbert.cli (commands)"),
    # the grounding analysis once read the predictions through reports/aggregate.py
    (("xdbert.analysis.grounding", "xdbert.reports.aggregate"),
     "xdbert.analysis.grounding (analysis) imports xdbert.reports.aggregate (reports)"),
    # what a run computes keys the run cache: the grid must stay out of it
    (("xdbert.finetuning.compute.loop", "xdbert.finetuning.control.grid"),
     "xdbert.finetuning.compute.loop (finetuning.compute) imports xdbert.finetuning.control.grid (finetuning.control)"),
])
def test_the_tier_check_sees_a_planted_later_import(edge, caught):
    module, planted = edge
    graph = {module: {"xdbert.io", planted}, planted: set(), "xdbert.io": set()}
    assert later_tier_imports(graph) == [caught]
    graph[module].discard(planted)
    graph[planted].add(module)  # the other way round is allowed
    assert later_tier_imports(graph) == []


def test_modules_stay_small():
    sizes = {m: len(module_file(m).read_text(encoding="utf-8").splitlines()) for m in package_modules()}
    assert max(sizes.values()) <= 520, f"modules over ~500 lines: { {m: n for m, n in sizes.items() if n > 520} }"
