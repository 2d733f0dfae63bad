"""Several finetuning runs sharing one GPU: real training tokens/s per GPU at 1, 2, 4, 8 runs per GPU.

On a machine without CUDA the same runs share the CPU, one thread each (a smoke test of the script).

The grid gives each worker a fraction of a GPU; this measures what that buys before any worker engine
is involved. For each K, K spawned processes share the one GPU the way K grid workers would: each
prepares the job (tokenizes), trains a warm-up seed (or stack) for one epoch (CUDA context, compiled
graphs and kernels per batch shape, the allocator: what a long-lived worker pays once), waits for the
others, then trains `--seeds` timed seeds of the pipeline's own `train_seed`. Throughput = real
(non-padding) training tokens of all timed seeds / wall time from the common start to the last finish;
MFU counts 6 x parameters x real tokens (the training FLOPs of the encoder, attention excluded) against
`--peak` bf16 TFLOP/s.

Model: a random BERT (`--size base`: 12 x 768) with a WordPiece vocabulary trained on the task text;
task: a GLUE stand-in (`--task`; RTE's pairs are about 30 real tokens, GLUE-like), `--train` examples.
`--kind full` trains the whole cross-modal model on that BERT instead (Table 8's runs): CLIP's ViT-B-32
text tower (the tiny CLIP at `--size tiny`) and the paper's 2 cross layers, random weights; its MFU
counts 6 x the model's parameters outside embedding tables, as the cost table counts `full` runs
(bench/adapt_stage_speed.py `--full-mfu`), and its projection is the paper grid's BERT-b `full` runs.
`--compile` compiles every run as `finetune.compile` does (on a GPU with CUDA graphs); `--compile-mode
default` compiles without them, for comparison. `--cuda-graph` records each whole step as one CUDA graph
(`finetune.cuda_graph`, xdbert.finetuning.compute.graphed; compiled runs then compile without torch's).
`--stack K` trains each process's seeds K at a time as one stacked model (`finetune.stack`,
xdbert.finetuning.compute.stacked): one call computes K runs, so `--runs 1 --stack 8 --seeds 8` puts 8 runs on
the GPU in one process, against `--runs 8` in 8 processes.

    python bench/finetune_share.py [--size base] [--kind encoder|full] [--task rte] [--runs 1,2,4,8] [--seeds 2] [--train 4000]
                                   [--compile [--compile-mode reduce-overhead|default]] [--cuda-graph] [--stack K]
                                   [--profile] [--sync-debug]

Writes bench/results/finetune_share.md and .json (or under --out).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import xdbert  # noqa: F401  (first: it fixes the CPU kernels and threads before torch and numpy load)
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapt_speed import profiled  # noqa: E402
from adapt_stage_speed import finetune_tokens, matmul_parameters  # noqa: E402
from finetune_speed import SIZES, build_bert, finetune_settings  # noqa: E402  (the same model and recipe)
from provenance import code_version, describe  # noqa: E402

from xdbert.data.synthetic.tasks import generate_task  # noqa: E402
from xdbert.data.tasks.registry import get_task  # noqa: E402
from xdbert.finetuning.compute import loop  # noqa: E402
from xdbert.finetuning.compute.keys import groups  # noqa: E402
from xdbert.finetuning.compute.stacked import train_group  # noqa: E402
from xdbert.finetuning.control.prepare import prepare  # noqa: E402
from xdbert.profiles import values  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# Table 1's two BERT-b rows: 9 tasks, 3 epochs, 5 seeds (RTE 9), about 38 real tokens an example.
TABLE1_BERT_TOKENS = 1.4e9


def build_full(directory: Path, bert_dir: Path, size: str) -> int:
    """A random cross-modal model on a random BERT of `bert_dir`'s size and vocabulary, saved as the `full`
    kind reads it: CLIP's ViT-B-32 text tower (the tiny CLIP at size tiny), the paper's 2 cross layers
    and 8 CLIP heads. Returns its parameters outside embedding tables, pretraining heads dropped."""
    from transformers import AutoConfig

    from xdbert.model.modeling import XDBertConfig, XDBertModel
    from xdbert.model.saving import save_full

    tiny = size == "tiny"
    torch.manual_seed(0)
    model = XDBertModel.build(XDBertConfig(
        encoder="random:bert", vocab_size=AutoConfig.from_pretrained(bert_dir).vocab_size,
        encoder_config={**SIZES[size], "max_position_embeddings": 128}, clip="xdbert-tiny" if tiny else "ViT-B-32",
        clip_heads=2 if tiny else 8, cross_layers=2))
    save_full(model, directory)
    return matmul_parameters(model.strip_heads())


def worker(kind, model_dir, bert_dir, tables, settings, seeds, compile_mode, barrier, results,
           profile: Path | None = None, sync_debug: bool = False) -> None:
    try:
        gpu = torch.cuda.is_available()
        device = "cuda" if gpu else "cpu"
        torch.set_num_threads(1)  # on a CPU each run is one core's, as in the grid
        loop.CUDA_COMPILE_MODE = None if compile_mode == "default" else compile_mode
        t0 = time.time()
        job = prepare(kind, model_dir, tables, settings, tokenizer_dir=bert_dir)
        progress(f"prepared in {time.time() - t0:.1f} s")
        t0 = time.time()
        # The warm-up trains one epoch: an epoch holds every batch shape, so every graph the timed seeds
        # need is compiled, and a stack of 8 does not train 8 whole runs before the timing starts.
        warm = dataclasses.replace(job, hyperparameters=dataclasses.replace(job.hyperparameters, epochs=1))
        train_group(warm, tuple(range(1000, 1000 + warm.hyperparameters.stack)), device)  # not timed
        if gpu:
            torch.cuda.synchronize()
        warmup = time.time() - t0
        progress(f"warmed up in {warmup:.1f} s")
        barrier.wait()
        start = time.time()
        if sync_debug and gpu:
            # every operation that makes the host wait for the GPU warns once, with the line that called it
            warnings.simplefilter("default")
            torch.cuda.set_sync_debug_mode("warn")
        runs, train_seconds = [], 0.0
        with profiled(profile is not None, profile):
            for group in groups(job, seeds):
                runs += train_group(job, group, device)
                train_seconds += runs[-1]["train_seconds"]  # a stack's seeds share its time
        if gpu:
            torch.cuda.set_sync_debug_mode(0)
            torch.cuda.synchronize()
        progress(f"timed seeds done in {time.time() - start:.1f} s")
        split, metric = settings.task.dev_splits[0], settings.task.metric
        tokens = int(job.data["train"].lengths.sum()) * settings.epochs
        results.put({"start": start, "end": time.time(), "tokens": tokens * len(seeds), "warmup_seconds": warmup,
                     "train_seconds": train_seconds,
                     "examples": sum(r["train_examples"] for r in runs),
                     "accuracy": [r["metrics"][split][metric] for r in runs],
                     "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if gpu else 0.0})
    except BaseException as e:  # the others must not wait for this one at the barrier
        barrier.abort()
        results.put({"error": f"{type(e).__name__}: {e}"})
        raise


def progress(message: str) -> None:
    """A timestamped line from a run process: when a time limit stops the script, the log still says
    how far each run got."""
    print(f"{time.strftime('%H:%M:%S')} pid {os.getpid()}: {message}", file=sys.stderr, flush=True)


def share(k: int, kind: str, model_dir: Path, bert_dir: Path, tables: dict, settings, seeds: list[int], compile_mode: str,
          profile: Path | None, sync_debug: bool = False) -> dict:
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(k), context.Queue()
    procs = [context.Process(target=worker, args=(kind, model_dir, bert_dir, tables, settings, [s + 10 * i for s in seeds],
                                                  compile_mode, barrier, results, profile if k == 1 else None,
                                                  sync_debug and k == 1))
             for i in range(k)]
    for p in procs:
        p.start()
    out = [results.get() for _ in procs]
    for p in procs:
        p.join()
    errors = sorted({r["error"] for r in out if "error" in r})
    if errors:
        return {"runs_per_gpu": k, "error": "; ".join(errors)}
    wall = max(r["end"] for r in out) - min(r["start"] for r in out)
    tokens, examples = sum(r["tokens"] for r in out), sum(r["examples"] for r in out)
    # In the training loops alone (each seed's model building and dev evaluation left out): the rate a
    # long run approaches, where those fixed costs are small beside its steps. The runs train side by
    # side, so their rates add up.
    loop_rate = sum(r["tokens"] / r["train_seconds"] for r in out)
    return {"runs_per_gpu": k, "wall_seconds": wall, "tokens_per_second": tokens / wall,
            "loop_tokens_per_second": loop_rate,
            "examples_per_second": examples / wall, "dev_accuracy": [a for r in out for a in r["accuracy"]],
            "peak_gib_per_run": max(r["peak_gib"] for r in out),
            "warmup_seconds": max(r["warmup_seconds"] for r in out)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=tuple(SIZES), default="base")
    ap.add_argument("--kind", choices=("encoder", "full"), default="encoder",
                    help="encoder: the BERT alone (Table 1's runs); full: the cross-modal model on it (Table 8's)")
    ap.add_argument("--task", default="rte", help="a GLUE stand-in with two-class accuracy")
    ap.add_argument("--runs", default="1,2,4,8", help="runs per GPU to measure, comma-separated")
    ap.add_argument("--seeds", type=int, default=2, help="timed seeds per run process")
    ap.add_argument("--train", type=int, default=4000, help="training examples of the RTE stand-in")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--compile", action="store_true", help="finetune.compile in every run")
    ap.add_argument("--cuda-graph", action="store_true", help="finetune.cuda_graph in every run: each step one CUDA graph")
    ap.add_argument("--stack", type=int, default=1, help="seeds trained as one stacked model (finetune.stack)")
    ap.add_argument("--compile-mode", choices=("reduce-overhead", "default"), default=loop.CUDA_COMPILE_MODE,
                    help="torch.compile's mode on a GPU (reduce-overhead: CUDA graphs, what the pipeline uses)")
    ap.add_argument("--profile", action="store_true",
                    help="with 1 run per GPU, write its timed seeds' kernels by GPU time (<name>_profile.txt)")
    ap.add_argument("--sync-debug", action="store_true",
                    help="with 1 run per GPU, warn at each operation of its timed seeds that waits for the GPU")
    ap.add_argument("--name", default="finetune_share", help="results file name, without suffix")
    ap.add_argument("--peak", type=float, default=989.0, help="bf16 dense TFLOP/s of the GPU (H100 SXM: 989)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    if args.kind == "full" and args.stack > 1:
        ap.error("--stack: only an encoder's seeds are stacked (finetune.stack); a full model trains each seed alone")
    spec = get_task(args.task)
    tables = generate_task(args.task, args.train, 400, seed=0)
    settings = finetune_settings(spec, args.lr, epochs=args.epochs, batch_size=args.batch_size, max_len=128,
                                 warmup_ratio=0.1, weight_decay=0.01, precision="auto", compile=args.compile,
                                 cuda_graph=args.cuda_graph, length_group=50, stack=args.stack)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        bert_dir = model_dir = Path(tmp) / "bert"
        build_bert(bert_dir, tables, spec, args.size)
        progress(f"random BERT {args.size} and its vocabulary built")
        from transformers import BertModel
        n_params = sum(p.numel() for p in BertModel.from_pretrained(bert_dir).parameters())
        projected = TABLE1_BERT_TOKENS
        if args.kind == "full":
            model_dir = Path(tmp) / "full"
            n_params = build_full(model_dir, bert_dir, args.size)
            projected = finetune_tokens(values("paper"))["bert-b"]["full"]
            progress("random cross-modal model built")
        for k in [int(x) for x in args.runs.split(",")]:
            t0 = time.time()
            profile = args.out / f"{args.name}_profile.txt" if args.profile else None
            row = share(k, args.kind, model_dir, bert_dir, tables, settings, list(range(args.seeds)), args.compile_mode,
                        profile, args.sync_debug)
            if "error" not in row:
                row["mfu"] = 6 * n_params * row["tokens_per_second"] / (args.peak * 1e12)
                row["loop_mfu"] = 6 * n_params * row["loop_tokens_per_second"] / (args.peak * 1e12)
                row["projected_gpu_hours"] = projected / row["tokens_per_second"] / 3600
            row["total_seconds"] = time.time() - t0
            rows.append(row)
            print(json.dumps(row), flush=True)
            write(args, n_params, rows)
    if any("error" in r for r in rows):
        sys.exit(1)  # the table says which failed; a calling script may try something else


def write(args, n_params: int, rows: list[dict]) -> None:
    done = [r for r in rows if "error" not in r]
    base = done[0]["tokens_per_second"] if done else None
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({platform.processor()})"
    gpu = torch.cuda.is_available()
    mode, compiled = "eager", None
    if args.compile:  # the mode is a GPU's: on a CPU, or with recorded steps, the pipeline compiles without CUDA graphs
        compiled = "default" if args.cuda_graph or not gpu else args.compile_mode
        mode = "compiled" if not gpu else f"compiled ({compiled})"
    if args.cuda_graph and gpu:
        mode += ", each step recorded as one CUDA graph"
    if args.stack > 1:
        mode += f", seeds stacked {args.stack} to a model call"
    model, counted, projection = f"Random BERT {args.size}", "parameters", "Table 1 BERT-b rows"
    if args.kind == "full":
        model, counted = f"Random cross-modal model on BERT {args.size}", "parameters outside embedding tables"
        projection = "paper grid's BERT-b `full` runs"
    result = {**code_version(), "device": device, "torch": torch.__version__, "size": args.size, "kind": args.kind, "parameters": n_params,
              "task": args.task, "train_examples": args.train, "epochs": args.epochs, "lr": args.lr,
              "batch_size": args.batch_size, "compile": compiled,
              "cuda_graph": args.cuda_graph, "stack": args.stack,
              "timed_seeds_per_process": args.seeds, "rows": rows,
              "machine": f"{platform.machine()}, {os.cpu_count()} cores"}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# Finetuning runs sharing one GPU ({device})", "",
             f"{model} ({n_params:,} {counted}), {args.task.upper()} stand-in ({args.train} training "
             f"examples), {args.epochs} epochs at lr {args.lr}, batch {args.batch_size}, bf16 autocast, {mode}; "
             f"{args.seeds} timed seeds per process after a one-epoch warm-up; torch {torch.__version__}.", "",
             "Real tokens/s counts every timed seed's wall time (building the model, training, dev evaluation); "
             "in loops counts the training loops alone, the rate a long run approaches.", "",
             f"| runs per GPU | real tokens/s | examples/s | vs 1 run | MFU | {projection}, GPU-hours | in loops: real tokens/s | MFU | peak GiB per run | dev accuracy | warm-up s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['runs_per_gpu']} | failed: {r['error'][:200]} | | | | | | | | | |")
            continue
        acc = r["dev_accuracy"]
        runs = r["runs_per_gpu"] if args.stack == 1 else f"{r['runs_per_gpu']} x {args.stack} stacked"
        lines.append(f"| {runs} | {r['tokens_per_second']:,.0f} | {r['examples_per_second']:,.0f} | "
                     f"{r['tokens_per_second'] / base:.2f}x | {r['mfu']:.1%} | {r['projected_gpu_hours']:.2f} | "
                     f"{r['loop_tokens_per_second']:,.0f} | {r['loop_mfu']:.1%} | "
                     f"{r['peak_gib_per_run']:.1f} | {min(acc):.3f}-{max(acc):.3f} | {r['warmup_seconds']:.0f} |")
    lines += ["", f"Rerun with `python {' '.join(sys.argv)}`. {describe(result)}"]
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
