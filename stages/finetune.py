"""Stage `finetune@<task>`: finetune every model of the study on one task, for every seed.

    python stages/finetune.py TASK

The runs of a task (`xdbert.finetuning.runs`) go through one process: the imports and the tokenization
of the task are paid once. Results: results/finetune/<task>/<run>/{metrics.json,predictions.parquet},
the task's folder written atomically. Every finished run is also kept in checkpoints/runs/ under a key of
what decided it (xdbert.finetuning.grid): a rerun of the stage, after a kill or after one of its models
changed, trains only the runs whose key is new.
"""
import sys

from xdbert import io, params, paths, runlog
from xdbert.errors import PipelineError
from xdbert.stage import run


def main() -> None:
    if len(sys.argv) != 2:
        raise PipelineError("usage: python stages/finetune.py TASK")
    from xdbert.data.tasks.registry import get_task
    from xdbert.finetuning import data as fd
    from xdbert.finetuning.runs import check_model_folders
    from xdbert.finetuning.settings import FinetuneSettings

    task = get_task(sys.argv[1])
    p = params.load()
    settings = FinetuneSettings.from_params(p, task)
    runs = settings.study.runs(task.name)
    check_model_folders(runs, paths.TOKENIZER)
    fd.task_files(paths.TASKS, task)  # every split is there, before any work

    # Heavy imports only once the inputs are known to be good: a typo fails in a second.
    from xdbert.finetuning.grid import run_grid, workers_from_env
    from xdbert.finetuning.job import prepare
    from xdbert.finetuning.results import write_results

    workers = workers_from_env()
    tables = fd.read_task(paths.TASKS, task)
    jobs = [prepare(r.model_kind, r.model_dir, tables, settings, tokenizer_dir=paths.TOKENIZER,
                    run_cache=paths.RUN_CACHE, protocol=r.protocol) for r in runs]
    # Every (model, seed) of the task goes to one pool: no worker idles while another finishes its share.
    all_results = run_grid([(job, settings.seeds_of(r)) for r, job in zip(runs, jobs)], workers)
    # The task's folder is DVC's one output: written whole, so a kill leaves all of its runs or none.
    with io.atomic_path(paths.FINETUNE / task.name, is_dir=True) as tmp:
        for r, job, results in zip(runs, jobs, all_results):
            metrics = write_results(tmp / r.name, job, results, {
                "run": r.name, "model": r.model, "model_path": job.model_path, "profile": p["profile"],
                "seeds_list": settings.seeds_of(r), "protocol": r.protocol, "lr_table": settings.lr,
            })
            print(f"finetune {task.name} {r.name}: median {task.metric} {metrics['headline']} over {len(results)} seeds")
    reused = sum(x["reused"] for results in all_results for x in results)
    total = sum(len(results) for results in all_results)
    print(f"finetune {task.name}: {reused} of {total} runs reused from {paths.RUN_CACHE}, {total - reused} trained")
    runlog.record(f"finetune@{task.name}", {"reused": reused, "trained": total - reused, "timings": {
        r.name: {str(x["seed"]): runlog.split_timings(x)[1] for x in results} for r, results in zip(runs, all_results)}})


if __name__ == "__main__":
    run(main)
