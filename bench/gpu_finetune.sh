#!/usr/bin/env bash
# One lease of the device machine (one GPU, torch and transformers there; ruamel.yaml carried as a wheel
# in .whl/): the finetuning speed measurements of bench/results/<gpu>/, most important first, each under
# its own time limit so one that hangs leaves the rest their time. Results land in $OUT (or bench/results/gpu).
#
#   bash bench/gpu_finetune.sh TASK EPOCHS LR TRAIN
set -u
task=${1:-sst2} epochs=${2:-5} lr=${3:-5e-5} train=${4:-2000}
out=${OUT:-bench/results/gpu}
source bench/gpu_env.sh
common=(--task "$task" --epochs "$epochs" --lr "$lr" --train "$train" --seeds 1 --out "$out")
# 1. CUDA graphs (what finetune.compile does on a GPU), 1 to 8 runs sharing the GPU
timeout 300 python3 bench/finetune_share.py "${common[@]}" --runs 1,2,4,8 --compile --name share_cudagraphs 2>&1 | tee -a "$out/log.txt" | tail -n 30
# 2. the eager reference, same machine, same call
timeout 110 python3 bench/finetune_share.py "${common[@]}" --runs 1,8 --name share_eager 2>&1 | tee -a "$out/log.txt" | tail -n 12
# 3. one run against the transformers Trainer (run_glue.py's recipe), both eager
timeout 150 python3 bench/finetune_speed.py --size base --task "$task" --epochs "$epochs" --lr "$lr" \
    --train "$train" --no-projection --out "$out" 2>&1 | tee -a "$out/log.txt" | tail -n 16
