#!/usr/bin/env bash
# One lease of the device machine (one GPU, torch and transformers there; ruamel.yaml carried as a wheel
# in .whl/): the finetuning speed measurements of bench/results/<gpu>/, most important first, each under
# its own time limit so one that hangs leaves the rest their time. Every timed step uses
# the same task and sizes, so the compile cache the first one fills serves the rest; a fresh machine's
# first compiled run needs over 120 s on its own. Each run process logs when it has prepared, warmed up
# and finished, so a step stopped by its limit still says how far it got.
#
#   XDBERT_COMMIT=... XDBERT_DIRTY=... bash bench/gpu_finetune.sh TASK EPOCHS LR TRAIN   (`python bench/provenance.py`)
# The defaults (rte 3 5e-5 6000) are the RTE stand-in's pairs, about 33 real tokens each, GLUE-like (the
# SST-2 stand-in's 12 understate a step's work). A tiny random BERT learns them on the CPU (dev accuracy
# 0.752, chance 0.5: finetune_share.py --size tiny --task rte --train 3000 --epochs 3 --lr 1e-3), and a
# random BERT-base on an H200 (0.757). `sst2 2 5e-5 6000` is the earlier leases' set (BERT-base: 0.955).
# STEPS picks the numbered steps below, each described where it runs; they run in this file's order,
# whatever their order in STEPS. The default "2 8 11 12": one compiled recorded run (it fills a cold
# compile cache for the rest), four such runs under CUDA's multi-process service (MPS), the same four
# taking turns without it, eight under MPS; about 450 s, 650 s if every step hits its limit. Steps 1-4
# and 8-9 were measured on 2026-11-27 and 2026-11-28
# (bench/results/h200). MORE=1 adds the unstacked path's profile and RUNS (default 8) compiled processes
# taking turns, then under MPS; TRAINER=1 adds the comparison with the transformers Trainer (both
# compiled, the pipeline recorded).
# Results and the whole log land in bench/results/gpu/, and as one archive in $OUT when $OUT is set,
# beside the compile cache (compile-cache.tgz: put it in the checkout as .compile-cache.tgz and carry it
# to skip the next lease's cold compile; bench/gpu_env.sh unpacks it).
set -u
task=${1:-rte} epochs=${2:-3} lr=${3:-5e-5} train=${4:-6000}
out=bench/results/gpu
source bench/gpu_env.sh
common=(--task "$task" --epochs "$epochs" --lr "$lr" --train "$train" --seeds 1 --out "$out")
pack() { [ -n "${OUT:-}" ] && tar -czf "$OUT/gpu_finetune.tgz" -C "$out" .; }
timed() {  # limit, then a python script and its arguments: one step, logged, its results packed
    local limit=$1; shift
    timeout "$limit" python3 "$@" >>"$out/log.txt" 2>&1
    local status=$?
    echo "$* (limit $limit s): exit $status" | tee -a "$out/log.txt"
    pack
    return $status
}
share() { local limit=$1; shift; timed "$limit" bench/finetune_share.py "${common[@]}" "$@"; }
# runs a command with CUDA's multi-process service (MPS) started for it, so that several processes' kernels
# share the GPU's units at once; without a control daemon on the machine, says so and runs nothing
under_mps() {
    if ! command -v nvidia-cuda-mps-control >/dev/null; then
        echo "no nvidia-cuda-mps-control on this machine: MPS not measured" | tee -a "$out/log.txt"
        return 1
    fi
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    local status=1
    if nvidia-cuda-mps-control -d; then
        "$@"
        status=$?
        echo quit | nvidia-cuda-mps-control
        # the server exits after the daemon: a process started before that would still run under MPS
        for _ in $(seq 20); do pgrep -x nvidia-cuda-mps-server >/dev/null || break; sleep 0.5; done
        cp "$CUDA_MPS_LOG_DIRECTORY/control.log" "$out/mps_control.log" 2>/dev/null
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    return $status
}
want() { [[ " ${STEPS:-2 8 11 12} " == *" $1 "* ]]; }  # STEPS: which numbered steps to run
# 1. one seed eagerly and with each step recorded as one CUDA graph, on the same seed: the losses and dev
#    predictions should agree (and the seed trained twice, by default and in deterministic mode)
#    If it fails, the recorded steps (2, 3) are skipped and step 4 runs instead: the lease's time goes to
#    what can still be measured, and the log says why the recording failed
recorded=1
if want 1 && ! timed 120 bench/gpu_determinism.py --size base --train 2000 --out "$out"; then
    recorded= STEPS="${STEPS:-2 8 11 12} 4"
    echo "step 1 failed: steps 2 and 3 skipped, step 4 added" | tee -a "$out/log.txt"
fi
# 2. one compiled run, each step one CUDA graph holding the compiled kernels: no host work between them
[ -n "$recorded" ] && want 2 && share 150 --compile --cuda-graph --runs 1 --name share_graph_1
# 3. 8 seeds stacked into one model (each kernel computes 8 runs), each step one CUDA graph: nothing to
#    compile, and a step of 8 runs is one launch
[ -n "$recorded" ] && want 3 && share 100 --cuda-graph --runs 1 --stack 8 --seeds 8 --name share_stack8_graph
# 4. one run compiled with torch.compile's own CUDA graphs (forward and backward): what finetune.compile
#    does on a GPU by default, and the previous leases' reference
want 4 && share 150 --compile --runs 1 --name share_1
# 5. step 3's stack unrecorded: eager, each kernel launched by the host
want 5 && share 100 --runs 1 --stack 8 --seeds 8 --name share_stack8_eager
# 6. step 3's stack compiled (a graph per 32-token length bucket, compiled cold: the longest limit), then
#    recorded; each recompile logged
want 6 && TORCH_LOGS=recompiles share 270 --compile --cuda-graph --runs 1 --stack 8 --seeds 8 --name share_stack8_graph_compiled
# 7. two processes of step 3's stack, 16 runs on the GPU
want 7 && share 120 --cuda-graph --runs 2 --stack 8 --seeds 8 --name share_stack8_graph_runs2
# 8. four compiled runs, each step recorded, taking turns under MPS: recorded, one run nearly fills the GPU
#    (2 and 4 runs without MPS made 181,900 and 186,791 real tokens/s, one run 173,312 on another H200),
#    so more runs pay only if their kernels overlap (they did: 233,705 on 2026-11-28)
want 8 && under_mps share 150 --compile --cuda-graph --runs 4 --name share_graph_4_mps
# 9. the whole cross-modal model (BERT-base, CLIP's text tower, 2 cross layers), compiled, each step recorded:
#    its CLIP layout is rounded like batch lengths, so a few graphs serve the task. Its MFU replaces the cost
#    table's assumed 3.8% for `full` runs (bench/adapt_stage_speed.py --full-mfu)
[ -n "$recorded" ] && want 9 && share 240 --kind full --compile --cuda-graph --runs 1 --name share_full_graph
# 10. step 9 with torch.compile's own CUDA graphs instead of recorded steps
want 10 && share 240 --kind full --compile --runs 1 --name share_full_cudagraphs
# 11. step 8 without MPS, on the same machine: what MPS adds (233,705 real tokens/s under it on one H200,
#     186,791 without on another)
[ -n "$recorded" ] && want 11 && share 150 --compile --cuda-graph --runs 4 --name share_graph_4
# 12. eight compiled recorded runs under MPS: does sharing pay past 4 once the kernels overlap?
[ -n "$recorded" ] && want 12 && under_mps share 200 --compile --cuda-graph --runs 8 --name share_graph_8_mps
# 13. four of step 9's whole-model runs under MPS: Table 8's `full` runs are about half of the paper run's
#     GPU-hours at one run's 6.3% MFU (bench/results/finetune_cost.md), so what sharing adds to them moves
#     the cost table most. Not in the default STEPS: with step 9's compile cache warm, about 240 s
[ -n "$recorded" ] && want 13 && under_mps share 240 --kind full --compile --cuda-graph --runs 4 --name share_full_graph_4_mps
# MORE=1: the unstacked path's diagnosis, for a lease with time to spare
if [ -n "${MORE:-}" ]; then
    # where a step goes: kernels by GPU time, host calls by CPU time, each operation that makes the host
    # wait for the GPU (with the line that called it), torch.compile's recompiles, graph breaks and
    # CUDA graphs it skipped. One epoch: the profiler slows every step
    TORCH_LOGS=recompiles,graph_breaks,perf_hints share 90 --compile --runs 1 --epochs 1 --name share_profile --profile --sync-debug
    # several runs taking turns on the GPU, each compiling with one Inductor thread (8 processes, each with a
    # pool of one compile thread per core, did not warm up within 130 s of a cold machine)
    TORCHINDUCTOR_COMPILE_THREADS=1 share 150 --compile --runs "${RUNS:-8}" --name share_runs
    # the same under MPS: without it the GPU runs one process's kernels at a time
    TORCHINDUCTOR_COMPILE_THREADS=1 under_mps share 150 --compile --runs "${RUNS:-8}" --name share_runs_mps
fi
# one run against the transformers Trainer (run_glue.py's recipe), both compiled, the pipeline's steps
# recorded: what the paper profile runs on a GPU
if [ -n "${TRAINER:-}" ]; then
    timeout 200 python3 bench/finetune_speed.py --size base --task "$task" --epochs "$epochs" --lr "$lr" \
        --train "$train" --compile --cuda-graph --no-projection --out "$out" >>"$out/log.txt" 2>&1
    pack
fi
save_compile_cache
