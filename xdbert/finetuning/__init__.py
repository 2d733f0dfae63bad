"""Finetuning one model on one task for several seeds: the paper's GLUE / SWAG / READ protocol.

Read in this order:

    runs.py      which runs the study makes on a task (encoder, full, clip) and where their models live
    settings.py  `FinetuneSettings` (the `finetune` section, checked) and one run's `Hyperparameters`
                 with the paper's Table 5 learning rate
    data.py      tokenize a task split once; length-grouped, dynamically padded batches
    heads.py     the three model kinds behind one interface, each with a fresh task head
    rates.py     AdamW groups with the optional layer-wise learning-rate decay
    job.py       `prepare`: one (model, task) tokenized once, picklable for the workers
    loop.py      `train_seed`: one seed, trained and evaluated on every dev split
    graphed.py   a whole training step recorded as one CUDA graph and replayed (`finetune.cuda_graph`)
    stacked.py   `train_group`: several seeds trained as one stacked model (`finetune.stack`), or one alone
    engine.py    the grid's Ray workers: a local instance, or the cluster of RAY_ADDRESS
    grid.py      `run_grid`: every (job, seed) of the study at once; finished runs kept, a killed grid resumes
    results.py   per-seed metrics, medians over seeds, per-example predictions
"""
