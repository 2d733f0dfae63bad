"""What a finetuning run computes: a seed (or a stack of seeds) trained and evaluated from a prepared job.

Read in this order:

    hyperparameters.py  one run's `Hyperparameters`, the `finetune` values with its learning rate
    data.py             tokenize a task split once; length-grouped, dynamically padded batches
    heads.py            the three model kinds behind one interface, each with a fresh task head
    rates.py            AdamW groups with the optional layer-wise learning-rate decay
    job.py              `Job`: one (model, task) tokenized once, picklable for the workers; `build_model`
    loop.py             `train_seed`: one seed, trained and evaluated on every dev split
    graphed.py          a whole training step recorded as one CUDA graph and replayed (`finetune.cuda_graph`)
    stacked.py          `train_group`: several seeds trained as one stacked model (`finetune.stack`), or one alone
    keys.py             what decides a run's result: its group of seeds, the settings its kind reads, and the
                        code of this subpackage with its imports, as the key of the run cache

Nothing here imports `xdbert.params`, `xdbert.paths` or `xdbert.finetuning.control`, so a saved run is keyed by
this code alone: an edit to how runs are scheduled, logged or kept retrains nothing.
"""
