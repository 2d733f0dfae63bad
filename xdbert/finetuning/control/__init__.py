"""What runs the finetuning: the study's runs, their settings, the grid that schedules them, the files they leave.

Read in this order:

    runs.py         which runs the study makes on a task (encoder, full, clip) and where their models live
    settings.py     `FinetuneSettings` (the `finetune` section, checked), each run's `Hyperparameters` with the
                    paper's Table 5 learning rate
    prepare.py      `prepare`: one (model, task) read and tokenized once, as a `compute.job.Job`
    sizes.py        a saved model's parameters: what the grid orders its runs by and sizes its workers with
    progress.py     the grid's plan and progress lines
    cores.py        the machine's cores, shared by grids running at once
    engine.py       the grid's Ray workers: a local instance, or the cluster of RAY_ADDRESS
    grid.py         `run_grid`: every (job, seed) of the study at once; finished runs kept, a killed grid resumes
    results.py      per-seed metrics, medians over seeds, per-example predictions
    predictions.py  `read_predictions`: a run's per-example predictions, checked, for the tables and analyses

A change here retrains nothing: the run cache is keyed by `xdbert.finetuning.compute` alone.
"""
