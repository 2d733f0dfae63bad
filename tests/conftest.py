import importlib.util
import os
import sys
from pathlib import Path

import pytest

# Two workers share the 2 cores (pyproject's `-n 2`), and each process runs torch's OpenMP with 2 threads:
# by default an idle OpenMP thread spins for its next task, and spinning threads took the CPU from the
# other worker's (a third more CPU time in all). Passive threads sleep instead; results do not change,
# the thread counts and the work split are the same. Set before torch loads OpenMP, for every process the
# tests start too.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
assert "torch" not in sys.modules, "conftest must set OpenMP's environment before anything imports torch"

import xdbert  # noqa: E402,F401  first: it fixes the CPU kernels and thread counts before anything imports torch

# Tests never touch the network: any hub request must fail at once, not after retries.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Nor does DVC: each `dvc` command would otherwise fork an analytics daemon, which imports DVC again to post
# a report, on the cores the tests need.
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
# The suite runs on the CPU everywhere: several tests assert that two runs give bit-equal weights, which
# holds for fp32 CPU kernels, not for bf16 autocast and cuBLAS, and the finetuning grid would train
# on a GPU when it sees one. GPU checks are run on purpose (the bench scripts on a GPU
# machine), not by pytest.
os.environ["CUDA_VISIBLE_DEVICES"] = ""


def pytest_collection_modifyitems(items):
    """The end-to-end modules (`slow` as a whole: `pytestmark`) first. pytest-xdist hands each worker whole files
    in collection order (pyproject's `--dist loadfile --no-loadscope-reorder`); test_pipeline.py is half the
    suite's time, and started last it would leave the other core idle for minutes. Files with a few slow tests
    keep their place."""
    items.sort(key=lambda item: not any(m.name == "slow" for m in item.getparent(pytest.Module).own_markers))


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models train fastest on one thread; two threads on a busy 2-core machine spin and crawl.
    Modules that train them use it for all their tests: `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def load_stage(name: str):
    """stages/<name>.py as a fresh module, so that a test can call its `main` in-process
    (`from conftest import load_stage`)."""
    path = Path(__file__).resolve().parents[1] / "stages" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"stage_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def _ray_stopped_after_module():
    yield
    import ray

    ray.shutdown()


@pytest.fixture
def local_ray(_ray_stopped_after_module):
    """One local Ray instance for a module's grids, started by the first test that needs it (or again after
    a test stopped it) and stopped after the module's last test: starting and stopping one took about 4 s
    of each grid test. `run_grid` joins it, as the stage joins a cluster (`engine.connect` starts nothing
    while Ray runs)."""
    from xdbert.finetuning.control import engine

    engine.connect()
    yield


@pytest.fixture(scope="session")
def rehearsal(tmp_path_factory) -> Path:
    """A rehearsal folder with the tiny mirror, its lock, params and inputs; `dvc repro` not run. Read by
    test_rehearse.py and test_fetch_check.py (which corrupts hard-linked copies of it, never the folder
    itself). Session-scoped: each xdist worker builds it once, for whichever of the two files it is given
    (`--dist loadfile`), instead of once per file."""
    from xdbert import rehearse

    folder = tmp_path_factory.mktemp("rehearsal") / "r"
    rehearse.prepare(folder, "tiny", say=lambda line: None)
    return folder


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> Path:
    """A tiny random BERT and its tokenizer (keyword_tasks.save_tiny_bert), what the finetuning tests train."""
    from keyword_tasks import save_tiny_bert

    return save_tiny_bert(tmp_path_factory.mktemp("bert") / "tiny")


@pytest.fixture(scope="module")
def crossmodal_dirs(tmp_path_factory, bert_dir):
    """A tiny full cross-modal model (`full`) and CLIP tower (`clip`) that read `bert_dir`'s token ids."""
    import torch
    from transformers import AutoTokenizer

    from xdbert.model.clip_tower import CLIPTextTower
    from xdbert.model.modeling import XDBertConfig, XDBertModel
    from xdbert.model.saving import save_clip_tower, save_full

    root = tmp_path_factory.mktemp("xmodels")
    torch.manual_seed(0)
    vocab = len(AutoTokenizer.from_pretrained(bert_dir))  # the full model reads the test tokenizer's ids
    config = XDBertConfig(encoder="random:bert", vocab_size=vocab, clip="xdbert-tiny", clip_heads=2, cross_layers=1,
                          encoder_config={"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                                          "intermediate_size": 64, "max_position_embeddings": 64})
    save_full(XDBertModel.build(config), root / "full")
    save_clip_tower(CLIPTextTower.build("xdbert-tiny"), root / "clip", clip="xdbert-tiny")
    return root


# ----------------------------------------------------------------------------------------------------
# The fast tier, `pytest -m "not slow"`: the contributors' inner loop still imports every module
# ----------------------------------------------------------------------------------------------------

FAST_TIER = "not slow"
_worker_modules: set[str] = set()  # xdist's controller runs no test: the modules its workers imported
_not_imported: list[str] = []


def _loaded() -> set[str]:
    return {name for name in sys.modules if name.split(".")[0] == "xdbert"}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    _worker_modules.update(getattr(node, "workeroutput", {}).get("xdbert_modules", ()))


def pytest_sessionfinish(session, exitstatus):
    """Over the whole suite (pyproject's testpaths, no -k), a fast tier that passed but never imported a
    module of the package fails: an edit there would meet no test in the loop contributors run."""
    config = session.config
    if hasattr(config, "workerinput"):  # an xdist worker: its modules go to the controller
        config.workeroutput["xdbert_modules"] = sorted(_loaded())
        return
    whole = config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.getoption("keyword")
    if config.getoption("markexpr") != FAST_TIER or not whole or exitstatus != pytest.ExitCode.OK:
        return
    from xdbert.imports import package_modules

    _not_imported.extend(sorted(set(package_modules()) - (_worker_modules or _loaded())))
    if _not_imported:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if _not_imported:
        terminalreporter.section("the fast tier imports no test of these modules", red=True)
        terminalreporter.line("\n".join(_not_imported))
        terminalreporter.line('give each a test outside `slow`: `pytest -m "not slow"` must reach every module')
