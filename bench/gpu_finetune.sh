#!/usr/bin/env bash
# One lease of the device machine (one GPU, torch and transformers there; ruamel.yaml carried as a wheel
# in .whl/): the finetuning speed measurements of bench/results/<gpu>/, most important first, each under
# its own time limit so one that hangs leaves the rest their time. Results land in bench/results/gpu/, and
# as one archive in $OUT when $OUT is set (the device tool brings back at most 8 files).
#
#   bash bench/gpu_finetune.sh TASK EPOCHS LR TRAIN
# RUNS (default 1,8): runs per GPU without MPS; MPS_RUNS (default 8): with it; TRAINER=1 adds the
# comparison with the transformers Trainer.
set -u
task=${1:-sst2} epochs=${2:-2} lr=${3:-5e-5} train=${4:-6000}
out=bench/results/gpu
source bench/gpu_env.sh
common=(--task "$task" --epochs "$epochs" --lr "$lr" --train "$train" --seeds 1 --out "$out" --compile)
pack() { [ -n "${OUT:-}" ] && tar -czf "$OUT/gpu_finetune.tgz" -C "$out" .; }
# 1. CUDA graphs (what finetune.compile does on a GPU), runs taking turns on the GPU
timeout 240 python3 bench/finetune_share.py "${common[@]}" --runs "${RUNS:-1,8}" --name share 2>&1 | tee -a "$out/log.txt" | tail -n 12
pack
# 2. the same under MPS (CUDA's multi-process service): without it the GPU runs one process's kernels at a
#    time, and each run's kernels are too small to fill it; with it, several processes' kernels run side by
#    side. Skipped where the machine has no MPS control daemon.
if command -v nvidia-cuda-mps-control >/dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
        timeout 150 python3 bench/finetune_share.py "${common[@]}" --runs "${MPS_RUNS:-8}" --name share_mps 2>&1 | tee -a "$out/log.txt" | tail -n 12
        echo quit | nvidia-cuda-mps-control
        cp "$CUDA_MPS_LOG_DIRECTORY/control.log" "$out/mps_control.log" 2>/dev/null
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    pack
else
    echo "no nvidia-cuda-mps-control on this machine: MPS not measured" | tee -a "$out/log.txt"
fi
# 3. where one run's step goes: its kernels by GPU time (the compile cache is warm by now)
timeout 90 python3 bench/finetune_share.py "${common[@]}" --train 1000 --runs 1 --name share_profile --profile 2>&1 | tail -n 3
pack
# 4. one run against the transformers Trainer (run_glue.py's recipe), both eager
if [ -n "${TRAINER:-}" ]; then
    timeout 150 python3 bench/finetune_speed.py --size base --task "$task" --epochs "$epochs" --lr "$lr" \
        --train "$train" --no-projection --out "$out" 2>&1 | tee -a "$out/log.txt" | tail -n 16
    pack
fi
