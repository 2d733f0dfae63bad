#!/usr/bin/env bash
# One lease of the device machine for issue 24's measurement: the adapt stage's own loop at the paper's
# sizes (bench/adapt_stage_speed.py). In order of what matters if the lease runs short: every family's two
# Table 1 adaptations then every ablation, eager; BERT-b's XDBERT under DDP with one process; BERT-b's two
# compiled. Each run writes after every row, so one stopped by its limit keeps what it measured.
#
# The machine has torch, transformers, accelerate, pyarrow and timm, but not open_clip or ruamel.yaml: put
# those wheels in .whl/ first, for the machine's Python 3.12, and carry .whl (about 5 MB):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl open_clip_torch==3.3.0 timm==1.0.31 ftfy wcwidth ruamel.yaml
# To time a change against the code before it on the same machine, unpack the older commit's package and
# benchmarks into an ignored folder and carry it too: its bench first times BERT-b's XDBERT with its
# package (run "reference"; this checkout's bench may import what the older package lacks):
#   mkdir .ref && git archive COMMIT xdbert bench | tar -x -C .ref && REF=.ref bash bench/gpu_adapt.sh
#
#   XDBERT_COMMIT=... XDBERT_DIRTY=... bash bench/gpu_adapt.sh [STEPS]   (the assignments: `python bench/provenance.py` here)
# Results land in bench/results/gpu/, and as one archive in $OUT when $OUT is set (the device tool brings
# back at most 8 files), beside the compile cache (compile-cache.tgz; bench/gpu_env.sh says how it is
# carried back). Narrower calls: EAGER_ARGS (default "--variants all") picks step 1's runs, SKIP_DDP=1 and
# SKIP_COMPILED=1 leave out steps 2 and 3, COMPILED_VARIANTS (default xdbert,baseline) picks step 3's,
# SYNC_DEBUG=1 adds a run that names every line where the host waits for the GPU (step 0b), COMPILED_ARGS
# adds arguments to step 3 (e.g. "--micro-batch 128").
# For example, BERT-b's XDBERT alone, eager and compiled, beside the older commit (about 300 s):
#   REF=.ref EAGER_ARGS="--families bert-b --variants xdbert" SKIP_DDP=1 COMPILED_VARIANTS=xdbert bash bench/gpu_adapt.sh
set -u
steps=${1:-4}
out=bench/results/gpu
source bench/gpu_env.sh
export HF_HUB_OFFLINE=1
run() {  # name, time limit, command...
    local name=$1 limit=$2; shift 2
    mkdir -p "$out/$name"
    timeout "$limit" "$@" --steps "$steps" --out "$out/$name" 2>&1 | tee -a "$out/log.txt" | grep -v "it/s\]" | tail -n 40
    [ -n "${OUT:-}" ] && tar -czf "$OUT/gpu_adapt.tgz" -C "$out" .
}
# 0. the reference: BERT-b's XDBERT with the older package first on the path
if [ -n "${REF:-}" ]; then
    run reference 60 env PYTHONPATH="$REF:$PYTHONPATH" python3 "$REF/bench/adapt_stage_speed.py" --families bert-b --variants xdbert
fi
# 0b. with SYNC_DEBUG=1: every line of the stage's code that makes the host wait for the GPU, named once
[ -z "${SYNC_DEBUG:-}" ] || run syncs 60 python3 bench/adapt_stage_speed.py --families bert-b --variants xdbert --sync-debug
# 1. every family's Table 1 adaptations, then adapt.family's ablations, eager (what the profiles run today)
run eager ${EAGER_LIMIT:-350} python3 bench/adapt_stage_speed.py ${EAGER_ARGS:---variants all}
# 2. DDP with one process (the path `accelerate launch` takes on a machine with several GPUs)
[ -n "${SKIP_DDP:-}" ] || run ddp 45 torchrun --nproc_per_node 1 bench/adapt_stage_speed.py --families bert-b --variants xdbert
# 3. compiled (adapt.compile: true): does compiling pay in the stage itself? The log names every graph
# break and recompile: the forward is meant to trace as one graph (tests/test_modeling.py checks it on
# the CPU, with this machine's torch and transformers it may differ).
[ -n "${SKIP_COMPILED:-}" ] || run compiled ${COMPILED_LIMIT:-150} env TORCH_LOGS=graph_breaks,recompiles \
    python3 bench/adapt_stage_speed.py --families bert-b --variants ${COMPILED_VARIANTS:-xdbert,baseline} --compile ${COMPILED_ARGS:-}
save_compile_cache
