"""Finetuning speed: this pipeline against a plain transformers `Trainer` set up like run_glue.py.

Both finetune the same random BERT (`--size tiny`: 2 layers x 128, the CPU default; `--size base`:
BERT-base, 12 x 768) with a WordPiece vocabulary trained on the task's training text, on the same task
data, one run each, with the same epochs, batch size, learning rate, warmup, weight decay, seed and
torch threads (default 1: how the pipeline runs each seed on a CPU; two threads on a busy 2-core
machine spin and slow both sides down several-fold). On a GPU both use bf16 autocast (the Trainer
through `bf16=True`, as run_glue.py's `--bf16`).

- pipeline: `xdbert.finetuning` - dynamic padding (lengths rounded up to 8 on a GPU), length-grouped
  batches, tokenized once.
- Trainer:  run_glue.py's defaults - every example padded to max_length 128, shuffled batches,
  `Trainer.train()` then `Trainer.predict()` on the dev split.

On a GPU each side runs twice in one process and both runs are reported: the first also pays one-time
set-up per new batch shape, the second is what a grid worker's further seeds cost.

Reported: training examples per second (examples x epochs / training wall time) of both, the ratio,
evaluation time, and the dev metric of each (they must be about equal: same model, same recipe;
batch composition differs, so not bit-equal). On a GPU also the projected cost of the paper's whole
Table 1 grid: the pipeline's examples/s for BERT-base and BERT-large sized encoders on examples that
fill all 128 positions (an upper bound: real GLUE examples are shorter and dynamic padding only
gains), times the GLUE/SWAG/READ training sizes, 3 epochs and 5 seeds (9 for RTE). Task data comes from data/tasks when the `tasks`
stage has run, else it is generated here with the tasks library (same sizes as params.yaml).

    python bench/finetune_speed.py [--task rte] [--size tiny|base] [--epochs 5] [--lr 1e-3] [--threads 1] [--compile]
                                   [--cuda-graph]

Writes bench/results/finetune_speed.md and .json.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

import xdbert  # noqa: F401  (first: it fixes the CPU kernels and threads before torch and numpy load)
import pyarrow as pa
import torch

from adapt_speed import PAPER_TRAIN_SIZES
from provenance import code_version, describe
from xdbert import params
from xdbert.data.synthetic.tasks import generate_task
from xdbert.data.tasks.metrics import compute_metrics
from xdbert.data.tasks.registry import TaskSpec, get_task
from xdbert.finetuning.compute import data as fd
from xdbert.finetuning.compute.heads import outputs_of
from xdbert.finetuning.compute.loop import pad_multiple, train_seed
from xdbert.finetuning.control.grid import run_seeds
from xdbert.finetuning.control.prepare import prepare
from xdbert.finetuning.control.settings import FinetuneSettings
from xdbert.profiles import values

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"tiny": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512},
         "base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
         "large": {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096}}
# Table 1's finetuned rows: 2 base encoders x (plain, XD) on 9 tasks, 2 large rows on all 10 (READ is
# reported for ELECTRA-large only); CLIP-T's 4 small tasks are negligible beside them.
TABLE1_ROWS = {"base": (4, [t for t in PAPER_TRAIN_SIZES if t != "read"]), "large": (2, list(PAPER_TRAIN_SIZES))}


def load_tables(task: str, train_size: int | None = None) -> tuple[dict, str]:
    """The task's data from data/tasks, or generated here (with `train_size` examples where given)."""
    spec = get_task(task)
    task_dir = ROOT / "data" / "tasks"
    if train_size is None and all((task_dir / task / f"{s}.parquet").is_file() for s in spec.splits):
        return fd.read_task(task_dir, spec), f"{task_dir.relative_to(ROOT)}/{task}"
    t = (params.read_yaml(ROOT / "params.yaml") or {}).get("tasks", {}) if (ROOT / "params.yaml").is_file() else {}
    size, dev, seed = train_size or t.get("train_size", 600), t.get("dev_size", 200), t.get("seed", 0)
    return generate_task(task, size, dev, seed), f"generated here (train {size}, dev {dev}, seed {seed})"


def finetune_settings(spec: TaskSpec, lr: float, **changes) -> FinetuneSettings:
    """The embedded profile's `finetune` settings with this benchmark's recipe, rate `lr` for every model size."""
    embedded = FinetuneSettings.from_params(values("embedded"), spec)
    return dataclasses.replace(embedded, lr={spec.name: {"base": lr, "large": lr}}, **changes)


def build_bert(directory: Path, tables: dict, spec, size: str) -> None:
    """A random BERT of `size` and a WordPiece vocabulary trained on the training text, save_pretrained."""
    from transformers import BertConfig, BertModel

    from xdbert.data.tokenization.vocab import train_wordpiece

    first, second, _ = fd.sentences(spec, tables["train"])
    tokenizer = train_wordpiece(first + (second or []), vocab_size=4000, model_max_length=128)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=128, **SIZES[size])
    BertModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def run_pipeline(model_dir: Path, spec, tables: dict, args) -> dict:
    settings = finetune_settings(spec, args.lr, epochs=args.epochs, batch_size=args.batch_size, max_len=128,
                                 warmup_ratio=0.1, weight_decay=0.01, precision="auto", compile=args.compile,
                                 cuda_graph=args.cuda_graph, length_group=args.length_group)
    t0 = time.time()
    job = prepare("encoder", model_dir, tables, settings)
    tokenize_seconds = time.time() - t0
    (run,) = run_seeds(job, [args.seed])  # on the GPU when there is one
    split = spec.dev_splits[0]
    lengths = job.data["train"].lengths
    m = pad_multiple(settings.max_len, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    return {"train_seconds": run["train_seconds"], "eval_seconds": run["eval_seconds"], "tokenize_seconds": tokenize_seconds,
            "metric": run["metrics"][split][spec.metric], "metrics": run["metrics"][split],
            "train_tokens_padded": int(sum(-(-lengths[b].max() // m) * m * len(b)
                                           for b in fd.length_grouped_batches(lengths, args.batch_size, args.seed, 0, args.length_group))),
            "train_tokens_real": int(lengths.sum()), "pad_multiple": m}


def run_trainer(model_dir: Path, spec, tables: dict, args, work: Path) -> dict:
    """run_glue.py's recipe: pad_to_max_length (128), AutoModelForSequenceClassification, Trainer defaults."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments, set_seed

    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def dataset(table) -> list[dict]:
        """A list of examples: the Trainer takes any map-style dataset, and GPU machines lack `datasets`."""
        first, second, _ = fd.sentences(spec, table)
        enc = tokenizer(first, second, padding="max_length", max_length=128, truncation=True)
        labels = fd.labels_of(spec, table).tolist()
        return [{**{k: v[i] for k, v in enc.items()}, "label": label} for i, label in enumerate(labels)]

    t0 = time.time()
    train, dev = dataset(tables["train"]), dataset(tables[spec.dev_splits[0]])
    tokenize_seconds = time.time() - t0
    set_seed(args.seed)
    model = AutoModelForSequenceClassification.from_pretrained(
        model_dir, num_labels=outputs_of(spec), problem_type="regression" if spec.kind == "regression" else None)
    targs = TrainingArguments(
        output_dir=str(work / "trainer"), per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=128,
        learning_rate=args.lr, num_train_epochs=args.epochs, warmup_steps=0.1, weight_decay=0.01, seed=args.seed,
        lr_scheduler_type="linear", save_strategy="no", logging_strategy="no", report_to="none",
        use_cpu=not torch.cuda.is_available(), bf16=torch.cuda.is_available(), disable_tqdm=True, torch_compile=args.compile)
    trainer = Trainer(model=model, args=targs, train_dataset=train)
    t0 = time.time()
    trainer.train()
    train_seconds = time.time() - t0
    t0 = time.time()
    out = trainer.predict(dev)
    eval_seconds = time.time() - t0
    scores = out.predictions
    pred = scores.reshape(-1) if spec.kind == "regression" else scores.argmax(-1)
    metrics = compute_metrics(spec.name, pred, fd.labels_of(spec, tables[spec.dev_splits[0]]))
    return {"train_seconds": train_seconds, "eval_seconds": eval_seconds, "tokenize_seconds": tokenize_seconds,
            "metric": metrics[spec.metric], "metrics": metrics,
            "train_tokens_padded": len(train) * 128, "train_tokens_real": None}


def project_grid(spec, tables: dict, args, work: Path) -> dict:
    """Pipeline examples/s of base and large encoders on full-length (128-token) examples, and the hours
    of Table 1's grid at those rates (GPU only)."""
    long = tables["train"].slice(0, 32 * 20)
    for column in ("text_a", "text_b"):
        if column in long.column_names and long.column(column).null_count < long.num_rows:
            texts = [" ".join([t] * 40) for t in long.column(column).to_pylist()]  # truncated at 128 tokens
            long = long.set_column(long.column_names.index(column), column, pa.array(texts))
    settings = finetune_settings(spec, 1e-5, epochs=1, batch_size=32, max_len=128, warmup_ratio=0.1,
                                 weight_decay=0.01, precision="auto", compile=args.compile, cuda_graph=args.cuda_graph,
                                 length_group=50)
    rates = {}
    for size in ("base", "large"):
        build_bert(work / size, tables, spec, size)
        job = prepare("encoder", work / size, {"train": long, spec.dev_splits[0]: long.slice(0, 32)}, settings)
        train_seed(job, args.seed, "cuda")  # warm-up: kernels, allocator
        run = train_seed(job, args.seed, "cuda")
        rates[size] = long.num_rows / run["train_seconds"]
    hours = {size: n_rows * sum(PAPER_TRAIN_SIZES[t] * 3 * (9 if t == "rte" else 5) for t in tasks) / rates[size] / 3600
             for size, (n_rows, tasks) in TABLE1_ROWS.items()}
    return {"examples_per_second_at_128": rates, "table1_gpu_hours_upper_bound": hours,
            "table1_gpu_hours_total": sum(hours.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="rte")
    ap.add_argument("--size", choices=("tiny", "base"), default="tiny", help="the encoder finetuned by both")
    ap.add_argument("--epochs", type=int, default=5, help="5: the tiny random BERT learns RTE's stand-in in 5, not 3")
    ap.add_argument("--lr", type=float, default=1e-3, help="tiny random-init models need far more than the paper's 1e-4")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--train", type=int, default=None, help="generate this many training examples (default: data/tasks)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile", action="store_true", help="torch.compile both sides (finetune.compile; the Trainer's torch_compile)")
    ap.add_argument("--cuda-graph", action="store_true", help="the pipeline records each step as one CUDA graph "
                    "(finetune.cuda_graph, GPU only; the Trainer has no such setting)")
    ap.add_argument("--length-group", type=int, default=None,
                    help="batches per length-sorted mega-batch (default: finetune.length_group in params.yaml)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of both; the pipeline's workers use 1 each on a CPU")
    ap.add_argument("--no-projection", dest="projection", action="store_false",
                    help="on a GPU, skip the Table 1 cost projection (base and large encoders at 128 tokens)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    if args.length_group is None:
        f = (params.read_yaml(ROOT / "params.yaml") or {}).get("finetune", {}) if (ROOT / "params.yaml").is_file() else {}
        args.length_group = f.get("length_group", 50)
    torch.set_num_threads(args.threads)
    spec = get_task(args.task)
    if spec.kind == "multiple_choice":
        raise SystemExit("the Trainer reference here is run_glue's (sequence classification); pick a GLUE task or READ")
    tables, source = load_tables(args.task, args.train)
    n_train = tables["train"].num_rows

    gpu = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        build_bert(work / "bert", tables, spec, args.size)
        if gpu:  # the CUDA context and cuBLAS start-up, paid by neither side's timing
            torch.ones(64, 64, device="cuda") @ torch.ones(64, 64, device="cuda")
        # On a GPU each side runs twice in this process: the first run also pays one-time set-up per new
        # batch shape (cuDNN attention plans, kernel selection), which a grid worker pays once for all its
        # seeds; the second is what every further seed costs.
        repeats = 2 if gpu else 1
        ours_runs = [run_pipeline(work / "bert", spec, tables, args) for _ in range(repeats)]
        ref_runs = [run_trainer(work / "bert", spec, tables, args, work) for _ in range(repeats)]
        grid = project_grid(spec, tables, args, work) if gpu and args.projection else None
    for r in ours_runs + ref_runs:
        r["examples_per_second"] = n_train * args.epochs / r["train_seconds"]
    ours, ref = ours_runs[-1], ref_runs[-1]
    ratio = ours["examples_per_second"] / ref["examples_per_second"]
    first_ratio = ours_runs[0]["examples_per_second"] / ref_runs[0]["examples_per_second"]

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    device = f"{torch.cuda.get_device_name(0)}, bf16 autocast" if torch.cuda.is_available() else "CPU, fp32"
    result = {
        **code_version(), "task": args.task, "data": source, "train_examples": n_train, "dev_examples": tables[spec.dev_splits[0]].num_rows,
        "epochs": args.epochs, "batch_size": args.batch_size, "length_group": args.length_group, "lr": args.lr, "seed": args.seed, "threads": args.threads,
        "model": f"random BERT {args.size} ({SIZES[args.size]['num_hidden_layers']} layers x {SIZES[args.size]['hidden_size']}), WordPiece 4000",
        "metric": spec.metric, "device": device, "compiled": args.compile, "cuda_graph": args.cuda_graph, "pipeline": ours, "trainer": ref, "speedup": ratio,
        "first_runs": {"pipeline": ours_runs[0], "trainer": ref_runs[0], "speedup": first_ratio} if gpu else None,
        "table1_projection": grid, "load_average_1min": load,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "finetune_speed.json").write_text(json.dumps(result, indent=2) + "\n")
    pad = ours["train_tokens_padded"] / ours["train_tokens_real"]
    first_row = first_note = ""
    if gpu:
        f, g = ours_runs[0], ref_runs[0]
        first_row = (f"| pipeline, first run in the process | {f['examples_per_second']:.1f} | {f['train_seconds']:.2f} | {f['eval_seconds']:.2f} | {f['tokenize_seconds']:.2f} | {f['metric']:.4f} |\n"
                     f"| Trainer, first run in the process | {g['examples_per_second']:.1f} | {g['train_seconds']:.2f} | {g['eval_seconds']:.2f} | {g['tokenize_seconds']:.2f} | {g['metric']:.4f} |\n")
        first_note = (f", between second runs in the process (a grid worker's every seed but its first); "
                      f"**{first_ratio:.2f}x** between first runs, which also pay one-time set-up per new batch shape")
    md = f"""# Finetuning speed: pipeline vs transformers Trainer (run_glue.py recipe)

Task `{args.task}` ({source}): {n_train} training / {result['dev_examples']} dev examples; {result['model']};
{args.epochs} epochs, batch {args.batch_size}, lr {args.lr}, warmup 0.1, weight decay 0.01, seed {args.seed},
{args.threads} torch threads, {device}{', torch.compile (both)' if args.compile else ''}{', the pipeline recording each step as one CUDA graph' if args.cuda_graph else ''} ({result['machine']}; 1-minute load average at the end {load:.2f}).

| | train examples/s | train s | eval s | tokenize s | dev {spec.metric} |
| --- | --- | --- | --- | --- | --- |
| pipeline (dynamic padding, length-grouped by {args.length_group} batches) | {ours['examples_per_second']:.1f} | {ours['train_seconds']:.2f} | {ours['eval_seconds']:.2f} | {ours['tokenize_seconds']:.2f} | {ours['metric']:.4f} |
| Trainer (padded to 128) | {ref['examples_per_second']:.1f} | {ref['train_seconds']:.2f} | {ref['eval_seconds']:.2f} | {ref['tokenize_seconds']:.2f} | {ref['metric']:.4f} |
{first_row}
**Speed-up: {ratio:.2f}x** training examples per second (goal: at least 2x){first_note}.
The pipeline's batches hold {pad:.3f} padded tokens per real token; the Trainer's
{ref['train_tokens_padded'] / ours['train_tokens_real']:.2f}. The dev metrics differ only through batch composition and order.
Timings on a shared machine vary from run to run; rerun with `{shlex.join(['python', *sys.argv])}`.
{describe(result)}
"""
    if grid:
        r, h = grid["examples_per_second_at_128"], grid["table1_gpu_hours_upper_bound"]
        md += f"""
## Projected cost of the paper's Table 1 grid on this GPU

Pipeline throughput on examples that fill all 128 positions (batch 32, bf16): BERT-base sized {r['base']:,.0f}
examples/s, BERT-large sized {r['large']:,.0f} examples/s. Table 1 finetunes 4 base rows on 9 tasks and 2 large
rows on 10, 3 epochs, 5 seeds (RTE 9), over the real training sizes ({sum(PAPER_TRAIN_SIZES.values()):,} examples
per pass of all ten tasks). Upper bound (every example 128 tokens): base rows {h['base']:.1f} GPU-hours, large rows
{h['large']:.1f} GPU-hours, **{grid['table1_gpu_hours_total']:.1f} GPU-hours in all** on one {torch.cuda.get_device_name(0)}.
"""
    (args.out / "finetune_speed.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
