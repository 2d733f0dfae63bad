"""Stage `finetune`: the whole finetuning grid, every model of the study on every task for every seed.

    python stages/finetune.py

Every run of every family and task (`xdbert.finetuning.runs`) is submitted at once to the grid's Ray
workers (xdbert.finetuning.grid), so a machine's cores and GPUs, or a cluster's, are all kept busy.
Results: results/finetune/<task>/<family>/<run>/{metrics.json,predictions.parquet} (CLIP-T:
<task>/clip_t), the folder written atomically. Every finished run is also kept in checkpoints/runs/ under
a key of what decided it: a rerun of the stage, after a kill or after one model, task or setting changed,
trains only the runs whose key is new.
"""
from xdbert import io, params, paths, runlog
from xdbert.stage import run


def read(p: dict) -> tuple:
    """(profile, the study's families, each task's settings): every param this stage reads, checked;
    tools/dvc_yaml.py records them for its `params:` in dvc.yaml."""
    from xdbert.data.tasks.registry import get_task, task_names
    from xdbert.finetuning.settings import FinetuneSettings
    from xdbert.model.settings import families

    return p["profile"], families(p), [FinetuneSettings.from_params(p, get_task(name)) for name in task_names(p)]


def main() -> None:
    from xdbert.finetuning import data as fd
    from xdbert.finetuning.runs import check_model_folders

    profile, study_families, task_settings = read(params.load())
    plan, tables = [], {}
    for settings in task_settings:
        task = settings.task
        runs = settings.study.runs(task.name)
        tables[task.name] = fd.read_task(paths.TASKS, task)  # every split is there and reads, before any work
        check_model_folders(runs, paths.TOKENIZER)
        plan.append((task, settings, runs))

    # Heavy imports only once the inputs are known to be good: a typo fails in a second.
    from xdbert.finetuning.engine import check_address, runs_per_gpu_from_env, workers_from_env
    from xdbert.finetuning.grid import run_grid
    from xdbert.finetuning.job import prepare
    from xdbert.finetuning.results import write_results

    # The machine's settings, checked before the tasks are tokenized (a CPU machine never reads the GPU's)
    workers = workers_from_env()
    runs_per_gpu_from_env()
    check_address()
    jobs = []
    for task, settings, runs in plan:
        task_tables = tables.pop(task.name)  # tokenized into the jobs: the text is not kept
        jobs.append([prepare(r.model_kind, r.model_dir, task_tables, settings, tokenizer_dir=paths.TOKENIZER,
                             run_cache=paths.RUN_CACHE, protocol=r.protocol, family=study_families.get(r.family))
                     for r in runs])
    work = [(job, settings.seeds_of(r)) for (_, settings, runs), task_jobs in zip(plan, jobs)
            for r, job in zip(runs, task_jobs)]
    flat = iter(run_grid(work, workers))
    # The results folder is DVC's one output: written whole, so a kill leaves all of its runs or none.
    log = {}
    with io.atomic_path(paths.FINETUNE, is_dir=True) as tmp:
        for (task, settings, runs), task_jobs in zip(plan, jobs):
            task_results = [next(flat) for _ in runs]
            for r, job, results in zip(runs, task_jobs, task_results):
                metrics = write_results(tmp / task.name / r.name, job, results, {
                    "run": r.name, "family": r.family, "model": r.model, "model_path": job.model_path,
                    "profile": profile,
                    "seeds_list": settings.seeds_of(r), "protocol": r.protocol, "lr_table": settings.lr,
                })
                print(f"finetune {task.name} {r.name}: median {task.metric} {metrics['headline']} over {len(results)} seeds")
            reused = sum(x["reused"] for results in task_results for x in results)
            total = sum(len(results) for results in task_results)
            print(f"finetune {task.name}: {reused} of {total} runs reused from {paths.RUN_CACHE}, {total - reused} trained")
            log[task.name] = {"reused": reused, "trained": total - reused, "timings": {
                r.name: {str(x["seed"]): runlog.split_timings(x)[1] for x in results} for r, results in zip(runs, task_results)}}
    runlog.record("finetune", {"tasks": log})


if __name__ == "__main__":
    run(main)
