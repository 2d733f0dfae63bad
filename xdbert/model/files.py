"""The files that mark a saved model folder, as `xdbert.model.saving` writes them: for what checks or reads
a folder without loading a model, and for what a finetuning run computes, which imports no `xdbert.paths`."""

CROSSMODAL_CONFIG = "xdbert_config.json"  # what marks a saved cross-modal model ...
CLIP_CONFIG = "clip_config.json"          # ... and a saved CLIP text tower (`pretrain_clip`'s output)
