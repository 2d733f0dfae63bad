#!/usr/bin/env bash
# One lease of the device machine (one GPU, torch and transformers there; ruamel.yaml carried as a wheel
# in .whl/): the finetuning speed measurements of bench/results/<gpu>/, most important first, each under
# its own time limit so one that hangs leaves the rest their time (about 600 s in all; a fresh machine's
# first compiled run alone needs over 120 s). Results and the whole log land in bench/results/gpu/, and
# as one archive in $OUT when $OUT is set (the device tool brings back at most 8 files).
#
#   bash bench/gpu_finetune.sh TASK EPOCHS LR TRAIN
# RUNS (default 8): runs per GPU after the single run; TRAINER=1 adds the comparison with the
# transformers Trainer.
set -u
task=${1:-sst2} epochs=${2:-2} lr=${3:-5e-5} train=${4:-6000}
out=bench/results/gpu
source bench/gpu_env.sh
common=(--task "$task" --epochs "$epochs" --lr "$lr" --train "$train" --seeds 1 --out "$out" --compile)
pack() { [ -n "${OUT:-}" ] && tar -czf "$OUT/gpu_finetune.tgz" -C "$out" .; }
share() {  # limit, then finetune_share.py's arguments
    local limit=$1; shift
    timeout "$limit" python3 bench/finetune_share.py "${common[@]}" "$@" >>"$out/log.txt" 2>&1
    echo "finetune_share.py $* (limit $limit s): exit $?" | tee -a "$out/log.txt"
    pack
}
# 1. one run with CUDA graphs (what finetune.compile does on a GPU): the reference for the rest
share 190 --runs 1 --name share_1
# 2. where its step goes: kernels by GPU time (the compile cache is warm by now)
share 70 --runs 1 --train 1000 --name share_profile --profile
# 3. several runs taking turns on the GPU, each compiling with one Inductor thread (with one compile
#    pool per core in every process, 8 processes did not warm up within 130 s in one lease)
TORCHINDUCTOR_COMPILE_THREADS=1 share 180 --runs "${RUNS:-8}" --name share_runs
# 4. the same under MPS (CUDA's multi-process service): without it the GPU runs one process's kernels at
#    a time, and each run's kernels are too small to fill it; with it, several processes' kernels run
#    side by side. Skipped where the machine has no MPS control daemon.
if command -v nvidia-cuda-mps-control >/dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
        TORCHINDUCTOR_COMPILE_THREADS=1 share 150 --runs "${RUNS:-8}" --name share_runs_mps
        echo quit | nvidia-cuda-mps-control
        cp "$CUDA_MPS_LOG_DIRECTORY/control.log" "$out/mps_control.log" 2>/dev/null
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    pack
else
    echo "no nvidia-cuda-mps-control on this machine: MPS not measured" | tee -a "$out/log.txt"
fi
# 5. one run against the transformers Trainer (run_glue.py's recipe), both eager
if [ -n "${TRAINER:-}" ]; then
    timeout 150 python3 bench/finetune_speed.py --size base --task "$task" --epochs "$epochs" --lr "$lr" \
        --train "$train" --no-projection --out "$out" >>"$out/log.txt" 2>&1
    pack
fi
