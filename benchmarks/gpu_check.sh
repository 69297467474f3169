#!/usr/bin/env bash
# Checks on a GPU machine (H100/H200): build the CUDA extension, run the test suite on the GPU,
# the benchmarks, Nsight Compute and compute-sanitizer, everything into few files under $OUT.
#
#   bash benchmarks/gpu_check.sh [--dry-run] [STAGE[:SECONDS] ...]
#
# Everything owed in three calls of the device tool (each at most 600 s; BUDGET=590 by default
# caps the stages of one call together, so a late stage gets what is left, not its own limit):
#   call 1: export OUT; WORKERS=12 bash benchmarks/gpu_check.sh env build:200 info suite:570
#   call 2: export OUT; bash benchmarks/gpu_check.sh build:150 bench-brief:590
#   call 3: export OUT; bash benchmarks/gpu_check.sh build:150 sanitizer:300 ncu-layer_norm:280
# (build is seconds on a machine still warm from the call before: the extension is cached.)
# The device tool brings back at most 8 files (16 MiB each, no deeper than $OUT/a/b/file), so
# $OUT holds only: gpu_check.log (every stage's output), results.tar.gz (junit XMLs, sanitizer
# logs, and every file the stages wrote under benchmarks/results: CSVs, ncu raw logs) and
# verified.json (the suite stage's benchmarks/record_verified.py, when it ran).
#
# Stages:
#   env build info demo overhead   as before (nvidia-smi and versions; python -m fusedops ...)
#   test          pytest ${PYTEST_ARGS:-tests} on WORKERS pytest-xdist workers
#   suite         the whole suite in three parts, a junit XML each: tests/test_bias_dropout_add.py
#                 first, alone in one worker (faulthandler names a crash's Python stack; the
#                 CUDA forward crashed a worker on 2026-11-24); then -m "not big_memory" on
#                 WORKERS workers; then -m big_memory in one worker; then
#                 benchmarks/record_verified.py --gpu <nvidia-smi name> --commit <sha> --junit ...
#                 --out $OUT/verified.json (commit: git rev-parse HEAD, else $FUSEDOPS_COMMIT;
#                 a missing record_verified.py or commit is a warning, not a failure)
#   bench-<op>    benchmarks/bench_<op>.py ${BENCH_ARGS}
#   bench-brief   every benchmarks/bench_*.py with --quick, each under its own time limit
#   sanitizer     compute-sanitizer --tool memcheck over the CUDA tests of bias_dropout_add, then
#                 the other CUDA kernels' tests (-k cuda, not big_memory), one process each,
#                 the caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1) so that reads
#                 past a tensor's end are seen; a log per part in the tarball
#   tune-<op>     benchmarks/tune_<op>.py;  ncu-<op>  benchmarks/ncu_<op>.py (Nsight Compute)
#   bench-xla: ViT-B/16 training step (BENCH_ARGS="--rounds 1 --steps 10"); bench-swin: Swin-T
#   training step, 4 configurations in subprocesses (e.g. bench-swin:1800).
# (default: env build info test bench-quick_gelu bench-adam). SECONDS: the stage's time limit
# (default 300); a stage past it gets SIGINT (pytest still writes its junit XML), then SIGKILL
# 20 s later. --dry-run prints each stage's limit and commands and runs nothing (no time passes
# in it: each stage shows its limit capped by the whole BUDGET).
# Uses the machine's own python3 (torch, triton, jax preinstalled, no network) with this
# checkout on PYTHONPATH; nothing is installed but the benchmark-only peer wheels in .whl/
# (Liger-Kernel, from benchmarks/fetch_peers.sh), into /tmp/fusedops-peers.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY_RUN=${GPU_CHECK_DRY_RUN:-0} # inherited by the inner per-stage calls
if [ "${1:-}" = --dry-run ]; then
    DRY_RUN=1
    shift
fi
OUT="${OUT:-benchmarks/results}"
BUDGET="${BUDGET:-590}"
PY="${PYTHON:-python3}"
# Scratch for the stages' many outputs (outside $OUT: only the tarball of it comes back).
SCRATCH="${GPU_CHECK_SCRATCH:-/tmp/fusedops-gpu-check}"
GPU_CHECK_DRY_RUN=$DRY_RUN
export OUT BUDGET PY SCRATCH GPU_CHECK_DRY_RUN
# faulthandler: a crashing Python process (a pytest worker too) prints its Python stack
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# JAX shares the GPU with torch: no preallocation of 75% of its memory.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
# The GPU run is what verifies kernels: automatic picks (hooks, modules, the demo, benchmarks)
# take the kernels here, verified or not (tests of the verified rule unset it themselves).
export FUSEDOPS_UNVERIFIED="${FUSEDOPS_UNVERIFIED:-1}"

# A command, or in a dry run its words.
run() {
    if [ "$DRY_RUN" = 1 ]; then
        printf '  +'
        printf ' %q' "$@"
        printf '\n'
        return 0
    fi
    "$@"
}

# run under a time limit: SIGINT first (pytest writes its junit XML), SIGKILL 20 s later.
limited() {
    local seconds=$1
    shift
    run timeout -s INT -k 20 "$seconds" "$@"
}

# Seconds this stage has left (STAGE_SECONDS from its start, STAGE_START).
stage_left() { echo $((STAGE_SECONDS - ($(date +%s) - STAGE_START))); }

# Per-script limit of bench-brief (seconds): together under call 2's 590 (tests/test_gpu_check.py
# adds them up); 0: not a GPU benchmark (bench_cpu_fallback measures the CPU fallback).
brief_seconds() {
    case "$1" in
    xla) echo 90 ;;
    swin) echo 80 ;;
    layer_norm | window_attention) echo 50 ;;
    cpu_fallback) echo 0 ;;
    *) echo 35 ;;
    esac
}

pytest_part() { # NAME SECONDS WORKERS PYTEST-ARGS...: one junit XML per part
    local name=$1 seconds=$2 workers=$3
    shift 3
    local xdist=()
    if [ "$workers" -gt 0 ]; then xdist=(-n "$workers"); fi
    echo "--- suite part $name (limit ${seconds}s, workers ${workers})"
    limited "$seconds" "$PY" -m pytest -q -rfEs -p no:cacheprovider \
        -o faulthandler_timeout=240 "${xdist[@]}" \
        --junitxml "$SCRATCH/junit/$name.xml" "$@"
    local rc=$?
    [ "$rc" -eq 5 ] && rc=0 # no test carries the marker (yet): nothing to run is not a failure
    echo "--- suite part $name: exit $rc"
    return "$rc"
}

# Whether pyproject.toml registers the big_memory marker: --strict-markers refuses -m with an
# unknown one. (The list is read whole: grep -q leaving early would fail the pipe, pipefail.)
big_memory_registered() {
    local markers
    markers=$("$PY" -m pytest -p no:cacheprovider --markers 2>/dev/null)
    grep -q "mark\.big_memory:" <<<"$markers"
}

commit_of_tree() {
    git rev-parse HEAD 2>/dev/null || echo "${FUSEDOPS_COMMIT:-}"
}

stage_suite() {
    local workers=${WORKERS:-4} rc=0
    run mkdir -p "$SCRATCH/junit"
    pytest_part bias_dropout_add $((STAGE_SECONDS / 5)) 1 tests/test_bias_dropout_add.py || rc=1
    if big_memory_registered; then
        pytest_part main $(($(stage_left) - 90)) "$workers" -m "not big_memory" \
            --ignore tests/test_bias_dropout_add.py tests || rc=1
        pytest_part big_memory $(($(stage_left) - 20)) 1 -m big_memory \
            --ignore tests/test_bias_dropout_add.py tests || rc=1
    else
        echo "note: no big_memory marker registered: the rest of the suite in one part"
        pytest_part main $(($(stage_left) - 30)) "$workers" \
            --ignore tests/test_bias_dropout_add.py tests || rc=1
    fi
    local commit gpu
    commit=$(commit_of_tree)
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
    if [ ! -f benchmarks/record_verified.py ]; then
        echo "warning: benchmarks/record_verified.py is missing: no verified.json"
    elif [ -z "$commit" ]; then
        echo "warning: not a git checkout and FUSEDOPS_COMMIT unset: no verified.json"
    else
        local junit=()
        for part in bias_dropout_add main big_memory; do # those written (a killed part: none)
            [ -f "$SCRATCH/junit/$part.xml" ] || [ "$DRY_RUN" = 1 ] &&
                junit+=(--junit "$SCRATCH/junit/$part.xml")
        done
        run "$PY" benchmarks/record_verified.py --gpu "${gpu:-unknown GPU}" --commit "$commit" \
            "${junit[@]}" --out "$OUT/verified.json" ||
            echo "warning: record_verified.py failed (exit $?)"
    fi
    return "$rc"
}

stage_bench_brief() {
    local rc=0 script op seconds
    for script in benchmarks/bench_*.py; do
        op=$(basename "$script" .py)
        op=${op#bench_}
        seconds=$(brief_seconds "$op")
        [ "$seconds" -eq 0 ] && continue
        [ "$seconds" -gt "$(stage_left)" ] && seconds=$(stage_left)
        if [ "$seconds" -le 5 ]; then
            echo "--- bench-brief $op: no time left (skipped)"
            rc=1
            continue
        fi
        echo "--- bench-brief $op (limit ${seconds}s)"
        limited "$seconds" "$PY" "$script" --quick
        local status=$?
        echo "--- bench-brief $op: exit $status"
        [ "$status" -ne 0 ] && rc=1
    done
    return "$rc"
}

stage_sanitizer() {
    local sanitizer rc=0
    sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    if [ "$DRY_RUN" != 1 ] && [ ! -x "$sanitizer" ]; then
        echo "compute-sanitizer not found (PATH, /usr/local/cuda/bin)"
        return 127
    fi
    run mkdir -p "$SCRATCH/sanitizer"
    # bias_dropout_add first (half the time), then the other CUDA kernels' tests in one process
    # (memcheck's start-up and torch's import under it cost tens of seconds each time)
    local others=(window_process swin_softmax window_attention nms quick_gelu layer_norm adam)
    local part seconds files select=(-k cuda)
    big_memory_registered && select+=(-m "not big_memory")
    for part in bias_dropout_add other_kernels; do
        seconds=$(($(stage_left) - 5))
        if [ "$part" = bias_dropout_add ]; then
            seconds=$((STAGE_SECONDS / 2))
            files=(tests/test_bias_dropout_add.py)
        else
            files=("${others[@]/#/tests/test_}")
            files=("${files[@]/%/.py}")
        fi
        [ "$seconds" -le 5 ] && echo "--- sanitizer $part: no time left (skipped)" && continue
        echo "--- sanitizer $part (limit ${seconds}s)"
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 limited "$seconds" "$sanitizer" --tool memcheck \
            --error-exitcode 99 --print-limit 50 --log-file "$SCRATCH/sanitizer/$part.log" \
            "$PY" -m pytest -q -rfE -p no:cacheprovider -p no:xdist --maxfail 5 \
            -o faulthandler_timeout=120 "${select[@]}" "${files[@]}"
        local status=$?
        echo "--- sanitizer $part: exit $status (99: memcheck found errors; 124: time limit)"
        # a part cut off by its time limit checked what it ran; an error report or a failure
        # of the tests under memcheck fails the stage
        [ "$status" -ne 0 ] && [ "$status" -ne 124 ] && rc=1
    done
    return "$rc"
}

stage() {
    case "$1" in
    env) run nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv &&
        run "$PY" -c "import torch, triton, jax; print('torch', torch.__version__, 'cuda',
torch.version.cuda, '| triton', triton.__version__, '| jax', jax.__version__, jax.devices())" ;;
    build) run "$PY" -m fusedops build ;;
    info) run "$PY" -m fusedops info ;;
    test) run "$PY" -m pytest -q -p no:cacheprovider -rfEs -o faulthandler_timeout=240 \
        ${WORKERS:+-n $WORKERS} ${PYTEST_ARGS:-tests} ;;
    suite) stage_suite ;;
    demo) run "$PY" -m fusedops demo ;;
    bench-brief) stage_bench_brief ;;
    bench-*)
        if [ ! -f "benchmarks/bench_${1#bench-}.py" ]; then
            echo "unknown stage $1: no benchmarks/bench_${1#bench-}.py"
            return 2
        fi
        run "$PY" "benchmarks/bench_${1#bench-}.py" ${BENCH_ARGS:-} ;;
    overhead) run "$PY" benchmarks/overhead.py ;;
    sanitizer) stage_sanitizer ;;
    tune-*) run "$PY" "benchmarks/tune_${1#tune-}.py" ;;
    ncu-*) run "$PY" "benchmarks/ncu_${1#ncu-}.py" ;;
    *) echo "unknown stage $1" && return 2 ;;
    esac
}

# Inner call: one stage, under the limit the outer call set.
if [ "${1:-}" = --stage ]; then
    STAGE_SECONDS=$2 STAGE_START=$(date +%s)
    stage "$3"
    exit $?
fi

mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
[ "$DRY_RUN" = 1 ] && LOG=/dev/null
STARTED=$(date +%s)
STAMP="$SCRATCH.stamp"
if [ "$DRY_RUN" != 1 ]; then
    rm -rf "$SCRATCH/junit" "$SCRATCH/sanitizer" # a warm machine's earlier call: packed then
    mkdir -p "$SCRATCH"
    touch "$STAMP"
fi

# results.tar.gz: the scratch folder and every file the stages wrote under benchmarks/results.
pack() {
    [ "$DRY_RUN" = 1 ] && return 0
    local written=() size
    mapfile -t written < <(find benchmarks/results -type f -newer "$STAMP" 2>/dev/null | sort)
    # paths in the tarball: gpu-check/... (the scratch folder) and benchmarks/results/...
    local sources=(-C "$(dirname "$SCRATCH")" "$(basename "$SCRATCH")")
    [ ${#written[@]} -gt 0 ] && sources+=(-C "$PWD" "${written[@]}")
    tar -czf "$OUT/results.tar.gz" --transform "s|^$(basename "$SCRATCH")|gpu-check|" \
        "${sources[@]}"
    size=$(stat -c %s "$OUT/results.tar.gz" 2>/dev/null || echo 0)
    echo "=== results.tar.gz: $(tar -tzf "$OUT/results.tar.gz" | grep -vc '/$') files, $size bytes" |
        tee -a "$LOG"
    [ "$size" -gt $((16 * 1024 * 1024)) ] && echo "=== warning: results.tar.gz is over 16 MiB" |
        tee -a "$LOG"
}

if [ "$DRY_RUN" != 1 ] && compgen -G ".whl/*.whl" >/dev/null; then
    # benchmark-only peers (benchmarks/fetch_peers.sh), without their dependencies so the
    # machine's torch/triton stay the ones measured
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/fusedops-peers .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/fusedops-peers"
fi

failed=()
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(env build info test bench-quick_gelu bench-adam)
for spec in "${stages[@]}"; do
    name="${spec%%:*}"
    seconds=300
    [[ "$spec" == *:* ]] && seconds="${spec##*:}"
    if ! [[ "$seconds" =~ ^[0-9]+$ ]]; then
        echo "=== $name: bad time limit '$seconds' (STAGE[:SECONDS])" | tee -a "$LOG"
        failed+=("$name")
        continue
    fi
    left=$((BUDGET - ($(date +%s) - STARTED) - 15)) # 15 s kept for packing
    [ "$seconds" -gt "$left" ] && seconds=$left
    if [ "$seconds" -le 0 ]; then
        echo "=== $name: no time left of BUDGET=${BUDGET}s (skipped)" | tee -a "$LOG"
        failed+=("$name")
        continue
    fi
    start=$(date +%s)
    echo "=== $name (limit ${seconds}s) $(date -u +%H:%M:%S)" | tee -a "$LOG"
    if [ "$DRY_RUN" = 1 ]; then
        bash "$0" --stage "$seconds" "$name"
        rc=$?
    else
        # the stage's own limit, and SIGKILL shortly after (pytest parts stop themselves first)
        timeout -k 10 "$((seconds + 5))" bash "$0" --stage "$seconds" "$name" 2>&1 | tee -a "$LOG"
        rc=${PIPESTATUS[0]}
    fi
    echo "=== $name: exit $rc in $(($(date +%s) - start))s" | tee -a "$LOG"
    [ "$rc" -ne 0 ] && failed+=("$name")
done
pack
echo "=== failed stages: ${failed[*]:-none}" | tee -a "$LOG"
[ ${#failed[@]} -eq 0 ]
