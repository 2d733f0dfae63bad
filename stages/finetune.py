"""Stage `finetune`: the whole finetuning grid, every model of the study on every task for every seed.

    python stages/finetune.py

Every run of every family and task (`xdbert.finetuning.control.runs`) is submitted at once to the grid's Ray
workers (xdbert.finetuning.control.grid), so a machine's cores and GPUs, or a cluster's, are all kept busy.
Results: results/finetune/<task>/<family>/<run>/{metrics.json,predictions.parquet} (CLIP-T:
<task>/clip_t, <task>/clip_nofacts_t), the folder written atomically; with the mechanism study on, its rows
on `vis` and the control task too (`Study.mechanism_runs`). Every finished run is also kept in the run cache
(`paths.run_cache`: xdbert-runs/ in DVC's cache, which every experiment of the repository shares) under a
key of what decided it: a rerun of the stage, after a kill or after one model, task or setting changed,
or a queued experiment's, trains only the runs whose key is new.

The log says the grid's plan as it starts, its progress, and each task's medians when its last run ends.
"""
from collections import Counter

from xdbert import io, params, paths, runlog
from xdbert.stage import run


def read(p: dict) -> tuple:
    """(profile, the study's families, each task's settings): every param this stage reads, checked;
    tools/dvc_yaml.py records them for its `params:` in dvc.yaml."""
    from xdbert.data.mechanism import VIS, MechanismSettings
    from xdbert.data.tasks.names import task_names
    from xdbert.data.tasks.registry import get_task
    from xdbert.finetuning.control.settings import FinetuneSettings
    from xdbert.model.families import families

    mechanism = MechanismSettings.from_params(p)  # its rows on `vis` and on its control task, where it is on
    tasks = task_names(p) + ([VIS] if mechanism.enabled else [])
    return p["profile"], families(p), [FinetuneSettings.from_params(p, get_task(name), mechanism) for name in tasks]


def main() -> None:
    from xdbert.finetuning.compute import data as fd
    from xdbert.finetuning.control.runs import check_model_folders

    profile, study_families, task_settings = read(params.load())
    plan, tables = [], {}
    for settings in task_settings:
        task = settings.task
        runs = settings.study.runs(task.name)
        tables[task.name] = fd.read_task(paths.TASKS, task)  # every split is there and reads, before any work
        check_model_folders(runs, paths.TOKENIZER)
        plan.append((task, settings, runs))

    # Heavy imports only once the inputs are known to be good: a typo fails in a second.
    from xdbert.finetuning.control.engine import check_address, runs_per_gpu_from_env, workers_from_env
    from xdbert.finetuning.control.grid import run_grid
    from xdbert.finetuning.control.prepare import prepare
    from xdbert.finetuning.control.progress import say
    from xdbert.finetuning.control.results import summarize, write_results

    # The machine's settings, checked before the tasks are tokenized (a CPU machine never reads the GPU's)
    workers = workers_from_env()
    runs_per_gpu_from_env()
    check_address()
    run_cache = paths.run_cache()
    jobs = []
    for task, settings, runs in plan:
        task_tables = tables.pop(task.name)  # tokenized into the jobs: the text is not kept
        jobs.append([prepare(r.model_kind, r.model_dir, task_tables, settings, tokenizer_dir=paths.TOKENIZER,
                             run_cache=run_cache, protocol=r.protocol, family=study_families.get(r.family))
                     for r in runs])
        # the paper profile's tasks take minutes to tokenize for every model: the log says how far it is
        say(f"finetune {task.name}: tokenized for {len(runs)} model{'s' * (len(runs) != 1)}")
    work = [(job, settings.seeds_of(r)) for (_, settings, runs), task_jobs in zip(plan, jobs)
            for r, job in zip(runs, task_jobs)]
    owners = [(task, r, job) for (task, _, runs), task_jobs in zip(plan, jobs) for r, job in zip(runs, task_jobs)]
    runs_left = Counter(task.name for task, _, _ in owners)
    medians: dict[str, list[str]] = {}

    def finished(i: int, results: list[dict]) -> None:
        """Every seed of job i is done: its median joins its task's, which print when the task's last job is done."""
        task, r, job = owners[i]
        medians.setdefault(task.name, []).append(
            f"finetune {task.name} {r.name}: median {task.metric} {summarize(job, results)['headline']} over {len(results)} seeds")
        runs_left[task.name] -= 1
        if not runs_left[task.name]:
            for line in medians.pop(task.name):
                say(line)

    flat = iter(run_grid(work, workers, finished))
    # The results folder is DVC's one output: written whole, so a kill leaves all of its runs or none.
    log = {}
    with io.atomic_path(paths.FINETUNE, is_dir=True) as tmp:
        for (task, settings, runs), task_jobs in zip(plan, jobs):
            task_results = [next(flat) for _ in runs]
            for r, job, results in zip(runs, task_jobs, task_results):
                write_results(tmp / task.name / r.name, job, results, {
                    "run": r.name, "family": r.family, "model": r.model, "model_path": job.model_path,
                    "profile": profile,
                    "seeds_list": settings.seeds_of(r), "protocol": r.protocol, "lr_table": settings.lr,
                })
            reused = sum(x["reused"] for results in task_results for x in results)
            total = sum(len(results) for results in task_results)
            say(f"finetune {task.name}: {reused} of {total} runs reused from {run_cache}, {total - reused} trained")
            log[task.name] = {"reused": reused, "trained": total - reused, "timings": {
                r.name: {str(x["seed"]): runlog.split_timings(x)[1] for x in results} for r, results in zip(runs, task_results)}}
    runlog.record("finetune", {"tasks": log})


if __name__ == "__main__":
    run(main)
