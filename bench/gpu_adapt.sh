#!/usr/bin/env bash
# One lease of the device machine for issue 24's measurement: the adapt stage's own loop at the paper's
# sizes (bench/adapt_stage_speed.py), every family and variant, eager then compiled, and BERT-b's XDBERT
# again under DDP with one process. Results land in $OUT (or bench/results/gpu).
#
# The machine has torch and transformers but not open_clip, accelerate, pyarrow or ruamel.yaml: put their
# wheels in .whl/ first, for the machine's Python (`--python-version`), and carry .whl. With pyarrow's 55 MB
# they come to 61 MB, the repository 2 MB: just under the 64 MiB upload.
#   pip download --no-deps -d .whl -c constraints.txt open_clip_torch timm accelerate pyarrow ruamel.yaml ftfy wcwidth
#
#   bash bench/gpu_adapt.sh [STEPS]
set -u
steps=${1:-4}
out=${OUT:-bench/results/gpu}
source bench/gpu_env.sh
export HF_HUB_OFFLINE=1
run() {  # name, time limit, command...
    local name=$1 limit=$2; shift 2
    mkdir -p "$out/$name"
    timeout "$limit" "$@" --steps "$steps" --out "$out/$name" 2>&1 | tee -a "$out/log.txt" | grep -v "it/s\]" | tail -n 30
}
# 1. every family, Table 1's two adaptations each, eager (what the profiles run today)
run eager 200 python3 bench/adapt_stage_speed.py --variants xdbert,baseline
# 2. the same compiled (adapt.compile: true): does compiling pay in the stage itself?
run compiled 200 python3 bench/adapt_stage_speed.py --variants xdbert,baseline --compile
# 3. every ablation variant of adapt.family, eager
run ablations 120 python3 bench/adapt_stage_speed.py --families bert-b --variants all
# 4. DDP with one process (the path `accelerate launch` takes on a machine with several GPUs)
run ddp 80 torchrun --nproc_per_node 1 bench/adapt_stage_speed.py --families bert-b --variants xdbert
