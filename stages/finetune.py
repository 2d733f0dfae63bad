"""Stage `finetune@<task>`: finetune every model of the study on one task, for every seed.

    python stages/finetune.py TASK

The runs of a task (one process: the imports and the tokenization of the task are paid once):
- `encoder` runs: models/adapted/<name> for each name in `finetune.models` (Table 1: the MLM baseline
  and XDBERT) and, on `finetune.ablation_tasks`, in `finetune.ablations` (Table 3);
- `full` runs (Table 8): models/crossmodal/<name> for each name in `finetune.full_models`;
- the `clip` run (Table 1's CLIP-T row) on `finetune.clip_tasks`: models/pretrained/clip.
Results: results/finetune/<task>/<run>/{metrics.json,predictions.parquet}, run = the encoder's name,
`full_<name>` or `clip_t`, each folder written atomically. Every finished seed is also kept in
checkpoints/finetune/<task>/<run>/ until all results are written, so a killed stage resumes with the
seeds it had not finished.
"""
import shutil
import sys
from pathlib import Path


from xdbert import params
from xdbert.errors import PipelineError
from xdbert.stage import run

KINDS = {  # kind: (model folder, file that must be in it, results folder name)
    "encoder": ("models/adapted/{}", "config.json", "{}"),
    "full": ("models/crossmodal/{}", "xdbert_config.json", "full_{}"),
    "clip": ("models/pretrained/{}", "clip_config.json", "{}_t"),
}
TOKENIZER_DIR = Path("models/tokenizer")
TASK_DIR = Path("data/tasks")
CHECKPOINT_DIR = Path("checkpoints/finetune")  # finished seeds of a killed run; outside DVC's outputs
PRECISIONS = ("auto", "bf16", "no")


def check_settings(f: dict, tasks: list) -> tuple[dict, dict[str, list[int]], int | str]:
    """Every `finetune` value these runs use, checked; returns (settings kwargs, seeds per task, workers)."""
    s = {key: params.positive(params.get(f, key, "finetune"), f"finetune.{key}")
         for key in ("epochs", "batch_size", "eval_batch_size", "max_len", "length_group", "clip_blocks_per_sentence")}
    if s["max_len"] > 512:
        raise PipelineError(f"`finetune.max_len` must be at most 512 (BERT's positions); got {s['max_len']}")
    for key in ("warmup_ratio", "weight_decay", "dropout"):
        s[key] = params.fraction(params.get(f, key, "finetune"), f"finetune.{key}")
    decay = params.get(f, "layer_lr_decay", "finetune")
    if not isinstance(decay, (int, float)) or isinstance(decay, bool) or not 0 < decay <= 1:
        raise PipelineError(f"`finetune.layer_lr_decay` must be in (0, 1] (1.0 = off, 0.9 = the paper's 'decay of 0.9'); got {decay!r}")
    s["layer_lr_decay"] = float(decay)
    s["precision"] = params.choice(params.get(f, "precision", "finetune"), "finetune.precision", PRECISIONS)
    s["compile"] = params.flag(params.get(f, "compile", "finetune"), "finetune.compile")
    lr = params.get(f, "lr", "finetune")
    seeds = {}
    for task in tasks:
        rates = lr.get(task.name) if isinstance(lr, dict) else None
        if not isinstance(rates, dict):
            raise PipelineError(f"`finetune.lr.{task.name}` must map base, large (and optionally full, the full cross-modal "
                                f"model) to learning rates; got {rates!r}")
        unknown = sorted(set(rates) - {"base", "large", "full"})
        if unknown:
            raise PipelineError(f"`finetune.lr.{task.name}` has unknown keys {unknown}; allowed: base, large, full (the full cross-modal model)")
        for size in ("base", "large", *(["full"] if "full" in rates else [])):
            params.positive(rates.get(size), f"finetune.lr.{task.name}.{size}", float)
        key = "rte_seeds" if task.name == "rte" else "seeds"
        chosen = params.get(f, key, "finetune")
        if not isinstance(chosen, list) or not chosen:
            raise PipelineError(f"`finetune.{key}` must be a non-empty list of integer seeds; got {chosen!r}")
        if any(not isinstance(x, int) or isinstance(x, bool) for x in chosen) or len(set(chosen)) != len(chosen):
            raise PipelineError(f"`finetune.{key}` must list distinct integers; got {chosen!r}")
        seeds[task.name] = chosen
    workers = params.get(f, "workers", "finetune")
    if workers != "auto":
        workers = params.positive(workers, "finetune.workers")
    return s, seeds, workers


def runs_for(f: dict, task: str) -> list[tuple[str, str, str]]:
    """(kind, model name, run name) of every run the study makes on `task`."""
    out = [("encoder", m, m) for m in f["models"]]
    if task in f["ablation_tasks"]:
        out += [("encoder", m, m) for m in f["ablations"]]
    out += [("full", m, f"full_{m}") for m in f["full_models"]]
    if task in f["clip_tasks"]:
        out.append(("clip", "clip", "clip_t"))
    return out


def main() -> None:
    if len(sys.argv) != 2:
        raise PipelineError("usage: python stages/finetune.py TASK")
    from xdbert.tasks.registry import get_task

    task = get_task(sys.argv[1])
    p = params.load()
    f = params.section(p, "finetune")
    settings, seeds, workers = check_settings(f, [task])
    runs = runs_for(f, task.name)
    for kind, name, _ in runs:
        pattern, required, _ = KINDS[kind]
        model_dir = Path(pattern.format(name))
        if not (model_dir / required).is_file():
            raise PipelineError(f"model folder {model_dir} is missing or has no {required}: run the stage that writes it "
                                f"(`dvc repro`); a `{kind}` model lives in {pattern.format('<name>')}")
    if any(k == "full" for k, _, _ in runs) and not any(TOKENIZER_DIR.glob("*.json")):
        raise PipelineError(f"missing BERT tokenizer {TOKENIZER_DIR}: run `dvc repro tokenize`")
    from xdbert import finetune_data as fd

    fd.task_files(TASK_DIR, task)  # every split is there, before any work

    # Heavy imports only once the inputs are known to be good: a typo fails in a second.
    import dataclasses

    from xdbert import finetuning as ft

    tables = fd.read_task(TASK_DIR, task)
    jobs = []
    for kind, name, run_name in runs:
        model_dir = Path(KINDS[kind][0].format(name))
        job = ft.prepare(kind, model_dir, task, tables, ft.FinetuneSettings(lr=0.0, **settings), tokenizer_dir=TOKENIZER_DIR)
        # Table 5: the rate depends on the task and on the model's size, known once its config is read
        job.settings = dataclasses.replace(job.settings, lr=ft.learning_rate(f["lr"], task, ft.size_of(job.width), kind))
        job.checkpoint_dir = str(CHECKPOINT_DIR / task.name / run_name)
        jobs.append(job)
    # Every (model, seed) of the task goes to one pool: no worker idles while another finishes its share.
    all_results = ft.run_grid([(job, seeds[task.name]) for job in jobs], workers)
    for (_, name, run_name), job, results in zip(runs, jobs, all_results):
        out = Path("results/finetune") / task.name / run_name
        metrics = ft.write_results(out, job, results, {
            "run": run_name, "model": name, "model_path": job.model_path, "profile": p["profile"],
            "seeds_list": seeds[task.name], "workers": workers, "lr_table": f["lr"],
        })
        print(f"finetune {task.name} {run_name}: median {task.metric} {metrics['headline']} over {len(results)} seeds -> {out}")
    shutil.rmtree(CHECKPOINT_DIR / task.name, ignore_errors=True)  # every result is written: the seeds have done their job


if __name__ == "__main__":
    run(main)
