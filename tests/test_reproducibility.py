"""Same commit, same bytes: the CPU kernel caps, no volatile data in outputs, and the cross-machine check.

The cross-machine check runs a small deterministic workload through the pipeline's own code (the generated
corpus, the WordPiece trainer, the encoder's pretraining stand-in, a finetuning run; and the float64
analyses: PWCCA in both conventions, the correlation metrics) and compares the hashes of what it computed
with those committed below. Every x86-64 machine must compute the same ones. When it fails on a new CPU
type, find what else decides the rounding there (xdbert/numerics.py) and fix that; do not change the hash.
"""
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from xdbert import numerics, runlog
from xdbert.reports.header import header

# sha256 of the workload below, computed on AMD EPYC family 26 (AVX-512) with the AVX2 caps and 2 threads.
WORKLOAD_HASH = "b9ea01b117407b80dc2883c4f020138df45610a9bf643a7598d213931487fda9"
# sha256 of the analysis workload below, computed on AMD EPYC family 25 (AVX-512) with OpenBLAS's Haswell
# kernels. Its SkylakeX kernels, which this CPU gets by default, compute another hash.
ANALYSIS_HASH = "0cf571632c06b0ceb50090034aaaba7a6e8e5919e7f942d7504f72e12879c058"


def test_import_caps_cpu_kernels_at_avx2():
    import scipy.linalg  # noqa: F401  (loads scipy's own OpenBLAS)
    from threadpoolctl import threadpool_info

    import xdbert  # noqa: F401  (applies the caps and thread counts)

    for key, value in numerics.THREAD_COUNTS.items():
        assert os.environ[key] == value
    assert torch.get_num_threads() == numerics.THREADS  # conftest imports xdbert before torch
    if numerics.X86_64:
        for key, value in numerics.CPU_KERNEL_CAPS.items():
            assert os.environ[key] == value
        assert torch.backends.cpu.get_cpu_capability() in ("AVX2", "DEFAULT")  # DEFAULT: a CPU without AVX2
        blas = [lib for lib in threadpool_info() if lib["internal_api"] == "openblas"]
        assert len(blas) >= 2  # numpy's and scipy's
        assert {lib["architecture"] for lib in blas} == {"Haswell"}, blas
        assert numerics.mkl_path() == "zen", \
            "MKL picks its own GEMM kernels: the install did not build xdbert/mkl_dispatch.c (no C compiler?)"


@pytest.mark.skipif(not numerics.X86_64, reason="the caps are x86-64 instruction sets")
def test_a_shell_that_exported_other_kernels_still_gets_the_caps():
    """The caps are set, not defaulted: an exported OPENBLAS_CORETYPE or thread count would change bytes."""
    env = {**os.environ, "OPENBLAS_CORETYPE": "Sandybridge", "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "3"}
    code = ("import xdbert, numpy, torch; from threadpoolctl import threadpool_info; "
            "print([l['architecture'] for l in threadpool_info() if l['internal_api'] == 'openblas'], "
            "torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["['Haswell']", torch.backends.cpu.get_cpu_capability(), str(numerics.THREADS)], out


def test_timings_go_to_the_run_log_not_the_metrics(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    metrics = {"steps": 3, "seconds": 1.5, "loss": 0.25, "runs": {"0": {"train_seconds": 2.0, "acc": 0.5}}, "mb_per_s": 9}
    kept, timings = runlog.split_timings(metrics)
    assert kept == {"steps": 3, "loss": 0.25, "runs": {"0": {"acc": 0.5}}}
    assert timings == {"seconds": 1.5, "runs": {"0": {"train_seconds": 2.0}}, "mb_per_s": 9}
    runlog.write_metrics(tmp_path / "m.json", metrics, "adapt@xdbert")
    assert json.loads((tmp_path / "m.json").read_text()) == kept
    logged = [json.loads(line) for line in (tmp_path / "logs/adapt_xdbert.jsonl").read_text().splitlines()]
    assert len(logged) == 1 and logged[0]["timings"] == timings and logged[0]["stage"] == "adapt@xdbert"
    assert "torch capability" in logged[0]["cpu"]


def test_report_header_names_inputs_not_the_checkout():
    text = header("Table 1", "embedded", "encoder `random:bert`", "5 per task")
    assert "commit" not in text and "- profile: **embedded**" in text and "- seeds: 5 per task" in text


def workload(tmp_path) -> dict[str, str]:
    """A few steps of the encoder stand-in and of finetuning, at the embedded profile's widths."""
    import dataclasses

    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    from xdbert.adaptation import pretraining
    from xdbert.adaptation.pretrain_settings import PretrainSettings
    from xdbert.data.synthetic.documents import generate_corpus
    from xdbert.data.synthetic.tasks import generate_task
    from xdbert.data.tokenization.vocab import train_wordpiece
    from xdbert.finetuning.compute.loop import train_seed
    from xdbert.finetuning.control.prepare import prepare
    from xdbert.finetuning.control.settings import FinetuneSettings
    from xdbert.data.tasks.registry import get_task
    from xdbert.profiles import values

    p = values("embedded")
    docs = generate_corpus(n_docs=12, sentences_per_doc=12, seed=0)["train"]
    tokenizer = train_wordpiece(docs, vocab_size=600, model_max_length=64)
    tokenizer.save_pretrained(tmp_path / "tok")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tok")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), **{**p["model"]["encoder_config"], "max_position_embeddings": 64})
    mlm = BertForMaskedLM(config)
    settings = dataclasses.replace(PretrainSettings.from_params(p), steps=12, max_len=48, checkpoint_every=100)
    metrics = pretraining.pretrain(mlm, tokenizer, pretraining.split_sentences(docs), settings, tmp_path / "ckpt.pt")
    mlm.save_pretrained(tmp_path / "encoder")
    tokenizer.save_pretrained(tmp_path / "encoder")

    spec = get_task("mrpc")
    tables = generate_task("mrpc", 96, 32, seed=0)
    ft = dataclasses.replace(FinetuneSettings.from_params(p, spec), epochs=1, max_len=48)
    result = train_seed(prepare("encoder", tmp_path / "encoder", tables, ft), seed=0)

    weights = hashlib.sha256()
    for name, tensor in sorted(mlm.state_dict().items()):
        weights.update(name.encode() + tensor.detach().numpy().tobytes())
    losses = [metrics["last_mlm_loss"], result["first_epoch_loss"], result["last_epoch_loss"]]
    predictions = np.asarray(result["predictions"]["dev"], dtype=np.int64)
    return {"pretrained weights": weights.hexdigest(),
            "losses": hashlib.sha256(np.asarray(losses, dtype=np.float64).tobytes()).hexdigest(),
            "dev predictions": hashlib.sha256(predictions.tobytes()).hexdigest()}


def analysis_workload() -> dict[str, str]:
    """Table 2's PWCCA in both conventions and the correlation metrics, on fixed float64 inputs."""
    from xdbert.analysis.cca import pwcca
    from xdbert.data.tasks.metrics import compute_metrics

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 24))
    y = np.tanh(x @ rng.normal(size=(24, 16))) + 0.5 * rng.normal(size=(400, 16))
    values = [pwcca(x, y, convention=c).value for c in ("svcca", "whitened")]
    labels = rng.uniform(0, 5, size=300)
    values += compute_metrics("stsb", labels + rng.normal(size=300), labels).values()
    return {"values": [repr(float(v)) for v in values],
            "hash": hashlib.sha256(np.asarray(values, dtype=np.float64).tobytes()).hexdigest()}


@pytest.mark.skipif(not numerics.X86_64, reason="the committed hash was computed with x86-64 kernels")
def test_this_machine_computes_the_committed_analysis_bytes():
    parts = analysis_workload()
    assert parts["hash"] == ANALYSIS_HASH, (
        f"this CPU computes other analysis bytes than the machine that committed ANALYSIS_HASH: "
        f"{numerics.cpu_description()}; values {parts['values']}. Find what decides the rounding here "
        "(xdbert/numerics.py); do not change the hash")


def test_this_machine_computes_the_committed_bytes(tmp_path):
    parts = workload(tmp_path)
    combined = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    assert combined == WORKLOAD_HASH, (
        f"this CPU computes other bytes than the machine that committed WORKLOAD_HASH: {numerics.cpu_description()}, "
        f"{torch.get_num_threads()} threads; parts {parts}. Find what decides the rounding here (xdbert/numerics.py); "
        "do not change the hash")
