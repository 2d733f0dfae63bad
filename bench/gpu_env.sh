# Sourced by the device machine's scripts (bench/gpu_*.sh): the wheels carried in .whl/ installed beside the
# machine's torch, this checkout importable, torch.compile's caches in one folder (filled from a carried
# .compile-cache.tgz when there is one), the GPU recorded in $out/gpu.txt ($out set by the caller).
mkdir -p "$out"
# The tree comes without .git, so the commit every result records (bench/provenance.py) is passed in from
# the checkout, as `python bench/provenance.py` prints it there: XDBERT_COMMIT=<sha> XDBERT_DIRTY=<0|1> bash bench/gpu_...
if [ ! -e .git ]; then
    echo "code: commit ${XDBERT_COMMIT:-unknown (no XDBERT_COMMIT passed in)}, dirty ${XDBERT_DIRTY:-unknown}" | tee "$out/commit.txt"
fi
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
# without them every bench fails at its imports: say so once, before the lease's time goes
python3 -c "import open_clip, ruamel.yaml" 2>/dev/null || {
    echo "open_clip or ruamel.yaml does not import: make .whl/ as bench/gpu_adapt.sh says, and carry it"; exit 1; }
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.txt"
# Inductor's compiled graphs and Triton's kernels: a fresh machine otherwise spends 90 s compiling before
# its first compiled step. Its entries are keyed by torch build and GPU, so elsewhere they simply miss.
export TORCHINDUCTOR_CACHE_DIR=/tmp/compile-cache TRITON_CACHE_DIR=/tmp/compile-cache/triton
mkdir -p "$TRITON_CACHE_DIR"
[ -f .compile-cache.tgz ] && tar -xzf .compile-cache.tgz -C "$TORCHINDUCTOR_CACHE_DIR"
save_compile_cache() {  # into $OUT, unless over the 16 MiB a file brought back may have
    [ -n "${OUT:-}" ] || return 0
    tar -czf /tmp/compile-cache.tgz -C "$TORCHINDUCTOR_CACHE_DIR" .
    local size; size=$(stat -c %s /tmp/compile-cache.tgz)
    if [ "$size" -lt $((16 * 1024 * 1024)) ]; then cp /tmp/compile-cache.tgz "$OUT/"; fi
    echo "compile cache: $size bytes" | tee -a "$out/log.txt"
}
