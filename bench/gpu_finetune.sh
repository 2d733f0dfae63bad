#!/usr/bin/env bash
# One lease of the device machine (one GPU, torch and transformers there; ruamel.yaml carried as a wheel
# in .whl/): the finetuning speed measurements of bench/results/<gpu>/, most important first, each under
# its own time limit so one that hangs leaves the rest their time. Results land in bench/results/gpu/, and
# as one archive in $OUT when $OUT is set (the device tool brings back at most 8 files).
#
#   bash bench/gpu_finetune.sh TASK EPOCHS LR TRAIN
set -u
task=${1:-sst2} epochs=${2:-5} lr=${3:-5e-5} train=${4:-2000}
out=bench/results/gpu
source bench/gpu_env.sh
common=(--task "$task" --epochs "$epochs" --lr "$lr" --train "$train" --seeds 1 --out "$out")
pack() { [ -n "${OUT:-}" ] && tar -czf "$OUT/gpu_finetune.tgz" -C "$out" .; }
# 1. CUDA graphs (what finetune.compile does on a GPU), 1, 4 and 8 runs taking turns on the GPU
timeout 240 python3 bench/finetune_share.py "${common[@]}" --runs 1,4,8 --compile --name share_cudagraphs 2>&1 | tee -a "$out/log.txt" | tail -n 30
pack
# 2. the same runs under MPS (CUDA's multi-process service): without it the GPU runs one process's kernels
#    at a time, and each run's kernels are too small to fill it; with it, several processes' kernels run
#    side by side. Skipped where the machine has no MPS control daemon.
if command -v nvidia-cuda-mps-control >/dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
        timeout 200 python3 bench/finetune_share.py "${common[@]}" --runs 4,8 --compile --name share_cudagraphs_mps 2>&1 | tee -a "$out/log.txt" | tail -n 30
        echo quit | nvidia-cuda-mps-control
        cp "$CUDA_MPS_LOG_DIRECTORY/control.log" "$out/mps_control.log" 2>/dev/null
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    pack
fi
# 3. one run against the transformers Trainer (run_glue.py's recipe), both eager
timeout 150 python3 bench/finetune_speed.py --size base --task "$task" --epochs "$epochs" --lr "$lr" \
    --train "$train" --no-projection --out "$out" 2>&1 | tee -a "$out/log.txt" | tail -n 16
pack
