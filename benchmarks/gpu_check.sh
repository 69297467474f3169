#!/usr/bin/env bash
# One call on a GPU machine (H100/H200): build the CUDA extension, run the test suite on the GPU
# and the benchmarks, writing one log and the benchmark CSVs under $OUT (default results/).
#
#   bash benchmarks/gpu_check.sh [STAGE[:SECONDS] ...]
#
# Stages: env build info test demo overhead bench-<op> (benchmarks/bench_<op>.py) tune-layer_norm
# ncu-layer_norm (Nsight Compute counters per kernel: DRAM passes, occupancy, registers, L2 hits)
# (default: env build info test bench-quick_gelu bench-adam). Each stage runs under a time
# limit (SECONDS, default 300) so one slow stage cannot hide the results of the others. It uses
# the machine's own python3 (torch, triton, jax preinstalled, no network) with this checkout
# on PYTHONPATH; nothing is installed but the benchmark-only peer wheels in .whl/ (Liger-Kernel,
# from benchmarks/fetch_peers.sh), into /tmp/fusedops-peers. WORKERS=N runs the tests on N
# pytest-xdist workers; PYTEST_ARGS replaces the test stage's target (default: tests); BENCH_ARGS go to bench stages.
# overhead: host time per call of small ops (benchmarks/overhead.py). bench-xla: ViT-B/16
# training step, eager vs partial_trace(xla) vs inductor (e.g. bench-xla:500 with
# BENCH_ARGS="--rounds 1 --steps 10"; add --dtype bfloat16 for a bf16 model). bench-swin_ops:
# Swin window gathers and attention softmax at Swin-T's four stages (BENCH_ARGS="--dtypes ...").
# bench-window_attention: Swin-T stage shapes vs eager/SDPA/compile (e.g. bench-window_attention:600).
# bench-swin: Swin-T training step, 4 configurations in subprocesses (e.g. bench-swin:1800).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/results}"
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# JAX shares the GPU with torch: no preallocation of 75% of its memory.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
PY="${PYTHON:-python3}"
failed=()
# Benchmark-only peers (benchmarks/fetch_peers.sh): wheels carried in .whl/, installed without
# their dependencies so the machine's torch/triton stay the ones measured.
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/fusedops-peers .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/fusedops-peers"
fi

stage() {
    case "$1" in
    env) nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv &&
        "$PY" -c "import torch, triton, jax; print('torch', torch.__version__, 'cuda',
torch.version.cuda, '| triton', triton.__version__, '| jax', jax.__version__, jax.devices())" ;;
    build) "$PY" -m fusedops build ;;
    info) "$PY" -m fusedops info ;;
    test) "$PY" -m pytest -q -p no:cacheprovider -rfEs ${WORKERS:+-n $WORKERS} ${PYTEST_ARGS:-tests} ;;
    demo) "$PY" -m fusedops demo ;;
    bench-*) "$PY" "benchmarks/bench_${1#bench-}.py" ${BENCH_ARGS:-} ;;
    overhead) "$PY" benchmarks/overhead.py ;;
    tune-*) "$PY" "benchmarks/tune_${1#tune-}.py" ;;
    ncu-*) "$PY" "benchmarks/ncu_${1#ncu-}.py" ;;
    *) echo "unknown stage $1" && return 2 ;;
    esac
}

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(env build info test bench-quick_gelu bench-adam)
for spec in "${stages[@]}"; do
    name="${spec%%:*}"
    seconds=300
    [[ "$spec" == *:* ]] && seconds="${spec##*:}"
    start=$(date +%s)
    echo "=== $name (limit ${seconds}s) $(date -u +%H:%M:%S)" | tee -a "$LOG"
    timeout "$seconds" bash -c "$(declare -f stage); PY='$PY'; stage '$name'" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc in $(($(date +%s) - start))s" | tee -a "$LOG"
    [ "$rc" -ne 0 ] && failed+=("$name")
done
if [ "$OUT" != benchmarks/results ]; then
    cp benchmarks/results/*.csv "$OUT"/ 2>/dev/null
fi
echo "=== failed stages: ${failed[*]:-none}" | tee -a "$LOG"
[ ${#failed[@]} -eq 0 ]
