"""Finetuning one model on one task for several seeds: the paper's GLUE / SWAG / READ protocol.

Two subpackages: `compute`, what a run computes and so what its saved result is keyed by, and `control`, the
study's runs, their settings, the grid that schedules them and the files they leave. `compute` imports
neither `control` nor the params nor the paths (tests/test_finetuning_layers.py).
"""
