#!/usr/bin/env bash
# Checks on a GPU machine (H100/H200): build the CUDA extension, run the test suite on the GPU,
# the benchmarks, Nsight Compute and compute-sanitizer, everything into few files under $OUT.
#
#   bash benchmarks/gpu_check.sh [--dry-run] [STAGE[:SECONDS] ...]
#
# Everything owed in four calls of the device tool (each at most 600 s; BUDGET=590 by default
# caps the stages of one call together, so a late stage gets what is left, not its own limit):
#   call 1: export OUT; WORKERS=12 SUITE_OPS="-tests/test_window_* -tests/test_swin_*" \
#           bash benchmarks/gpu_check.sh env build:120 info suite-ops:570
#   call 2: export OUT; WORKERS=12 SUITE_OPS="tests/test_window_* tests/test_swin_*" \
#           bash benchmarks/gpu_check.sh build:120 suite-ops:300 suite-rest:570
#   call 3: export OUT; bash benchmarks/gpu_check.sh build:150 bench-brief:590
#   call 4: export OUT; bash benchmarks/gpu_check.sh build:150 sanitizer:300 ncu-layer_norm:280
# Between calls 1 and 2, copy call 1's verified.json into fusedops/kernels/ (the working tree
# travels): call 2's record_verified.py starts from it, so its verified.json holds both.
# (build: 83 s on a fresh H200 on 2026-11-26, seconds on a machine still warm from the call
# before, the extension cached; a limit is a cap, so build:120 costs nothing when warm.)
# GPU time of the suite stages, estimated from the junit of the H200 run of 2026-11-26
# (main.xml.gz, 12 workers: 3234 s of case times ran in 319 s, so a part takes the sum of its
# files' case times / 12 + ~40 s of start-up, collection and tail); per file, seconds of case
# time: adam 1068, layer_norm 486, nms 151, deform_conv2d 115, dcn_hooks 35, layer_norm_hooks
# 34, adam_clip 26, rms_norm_variants 23, quick_gelu 22; the four window files ~1750 together
# (that run's call 2 ran them alone on 12 workers, ~97% in 160 s); the other files 700
# (hooks_transformers 197, swin_hooks 158, kernel_report 72, gpu_check 63, ...); tests/xla
# never ran on a GPU: 465 s on a CPU here, test_opinfo (237 s, uncollectable there) left out,
# counted 465-930 s. The whole op suite in one call would need ~460 s of the ~480 s left after
# env+build+info on a fresh machine: no margin, hence two calls.
#   call 1 suite-ops  ~285 s of its ~480 s: bias_dropout_add part 67 s (measured), no
#                     big_memory case in these files, ops part ~205 s, record_verified ~5 s
#   call 2 suite-ops  ~250 s (limit 300): collections ~20 s, big_memory part 32 s (measured),
#                     ops part ~185 s, record_verified ~5 s
#   call 2 suite-rest ~150-190 s of the ~240 s left after a fresh build (~320 s when warm)
# A part cut by its limit verifies none of the op files it left incomplete (record_verified.py
# says which); run suite-ops again with SUITE_OPS naming them (every file of their ops: an op
# is verified only when all its files ran in one suite-ops).
# The device tool brings back at most 8 files (16 MiB each, no deeper than $OUT/a/b/file), so
# $OUT holds only: gpu_check.log (every stage's output), results.tar.gz (junit XMLs, the
# suites' collections, sanitizer logs, and every file the stages wrote under
# benchmarks/results: CSVs, ncu raw logs) and verified.json (suite-ops' record_verified.py).
#
# Stages:
#   env build info demo overhead   as before (nvidia-smi and versions; python -m fusedops ...)
#   test          pytest ${PYTEST_ARGS:-tests} on WORKERS pytest-xdist workers; junit
#                 test.xml in the tarball, also when the limit cuts the run (SIGINT 15 s
#                 before it); failures named in the log as they happen (tests/live_failures.py)
#   suite-ops     the op test files (record_verified.py --list-op-files; SUITE_OPS: glob
#                 patterns of those to run, "-pattern" of those to leave out) in parts, a junit
#                 XML and a collection (pytest --collect-only -q, the same arguments) each:
#                 tests/test_bias_dropout_add.py first, alone in one worker (faulthandler names
#                 a crash's Python stack; the CUDA forward crashed a worker on 2026-11-24);
#                 then the others' -m big_memory cases in one worker (skipped when none); then
#                 the rest -m "not big_memory" on WORKERS workers (the longest part last: it gets
#                 the time left); then benchmarks/record_verified.py --gpu <nvidia-smi name>
#                 --commit <sha> --collected ... --junit ... --out $OUT/verified.json (commit:
#                 git rev-parse HEAD, else $FUSEDOPS_COMMIT; none: a warning). A kernel is
#                 verified only where every collected case of its files ran and none failed.
#   suite-rest    every other test file (tests/xla, hooks, runtime tools, scripts) the same way
#                 (-m "not big_memory" on WORKERS workers, then -m big_memory: none today,
#                 skipped); record_verified.py finds no op file in it and writes nothing.
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
# (default 300); the pytest stages (test, suite-*, sanitizer) stop pytest with SIGINT before it
# (pytest prints its summary and writes its junit XML), SIGKILL 20 s later; any stage still
# running 5 s past its limit gets SIGTERM, SIGKILL 10 s later. --dry-run prints each stage's
# limit and commands and runs nothing (no time passes in it: each stage shows its limit capped
# by the whole BUDGET).
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
# adds them up); 0: not in the brief (bench_cpu_fallback measures the CPU fallback; bench_models
# compiles whole models, its --quick alone takes a call: its own stage, bench-models).
brief_seconds() {
    case "$1" in
    xla) echo 90 ;;
    swin) echo 80 ;;
    layer_norm | window_attention) echo 50 ;;
    sgd) echo 25 ;; # one list (the 1.1B one), bf16, four providers
    cpu_fallback | models) echo 0 ;;
    *) echo 35 ;;
    esac
}

# pytest as every stage runs it: quiet, each failure named the moment it happens
# (tests/live_failures.py: a run killed by its limit still names them) and again in the summary
# (-rfEs), faulthandler's stacks of a case hung past 240 s.
PYTEST=(-m pytest -q -rfEs -p no:cacheprovider -p tests.live_failures -o faulthandler_timeout=240)

pytest_part() { # NAME SECONDS WORKERS PYTEST-ARGS...: one junit XML per part
    local name=$1 seconds=$2 workers=$3
    shift 3
    local xdist=() collected="$SCRATCH/collected/$name"
    if [ "$workers" -gt 0 ]; then xdist=(-n "$workers"); fi
    if [ -f "$collected.rc" ] && [ "$(cat "$collected.rc")" = 5 ]; then
        echo "--- suite part $name: no case collected (skipped)"
        return 0
    fi
    if [ "$seconds" -le 5 ]; then # (timeout 0 would mean no limit at all)
        echo "--- suite part $name: no time left (skipped; its files count as not run)"
        return 1
    fi
    echo "--- suite part $name (limit ${seconds}s, workers ${workers})"
    limited "$seconds" "$PY" "${PYTEST[@]}" "${xdist[@]}" --junitxml "$SCRATCH/junit/$name.xml" "$@"
    local rc=$?
    [ "$rc" -eq 5 ] && rc=0 # no test carries the marker (yet): nothing to run is not a failure
    echo "--- suite part $name: exit $rc"
    return "$rc"
}

# A part's collection: the node ids pytest collects for the part's arguments on this machine
# (which cases exist depends on the GPU), into $SCRATCH/collected/NAME.txt and its exit status
# into NAME.rc, in the background while the parts before it run (seconds of CPU each).
collect_part() { # NAME SECONDS WORKERS PYTEST-ARGS... (the arguments of pytest_part)
    local name=$1 file="$SCRATCH/collected/$1"
    shift 3
    PARTS+=("$name")
    if [ "$DRY_RUN" = 1 ]; then
        limited 150 "$PY" -m pytest --collect-only -q -rE -p no:cacheprovider "$@"
        echo "    (in the background, into $file.txt)"
        return 0
    fi
    (
        limited 150 "$PY" -m pytest --collect-only -q -rE -p no:cacheprovider "$@" >"$file.txt" 2>&1
        echo $? >"$file.rc"
    ) &
}

# Waits for the collections; once, a line per part: its cases, its exit (2: a file failed to
# import, named on the ERROR line after it).
collections_done() {
    wait
    [ "$DRY_RUN" = 1 ] || [ "$COLLECTIONS_SHOWN" = 1 ] && return 0
    COLLECTIONS_SHOWN=1
    local part file
    for part in "${PARTS[@]}"; do
        file="$SCRATCH/collected/$part"
        echo "--- collected $part: $(grep -c '\.py::' "$file.txt" 2>/dev/null) cases" \
            "(exit $(cat "$file.rc" 2>/dev/null || echo '?'))"
        grep '^ERROR ' "$file.txt" 2>/dev/null
    done
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

# verified.json from the parts' collections and junit (benchmarks/record_verified.py: a kernel
# only where every collected case of its files ran and none failed; a run of no op test file,
# suite-rest, writes none).
record_verified() { # PART...
    local commit gpu part parts=()
    commit=$(commit_of_tree)
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
    if [ -z "$commit" ]; then
        echo "warning: not a git checkout and FUSEDOPS_COMMIT unset: no verified.json"
        return 0
    fi
    for part in "$@"; do
        parts+=(--collected "$SCRATCH/collected/$part.txt" --junit "$SCRATCH/junit/$part.xml")
    done
    run "$PY" benchmarks/record_verified.py --gpu "${gpu:-unknown GPU}" --commit "$commit" \
        "${parts[@]}" --out "$OUT/verified.json" ||
        echo "warning: record_verified.py failed (exit $?)"
}

# The parts of suite-ops: "$1 NAME SECONDS WORKERS PYTEST-ARGS..." per part, $1 collect_part
# (first, all of them) or pytest_part. The op test files (OP_FILES: record_verified.py's
# OP_TEST_FILES, or those of them SUITE_OPS selects): tests/test_bias_dropout_add.py
# first, alone in one worker (faulthandler names a crash's Python stack; the CUDA forward
# crashed a worker on 2026-11-24), then the others' big_memory cases in one worker, then the
# rest of their cases on WORKERS workers (the longest part last: it gets what time is left).
ops_parts() {
    local each=$1 rc=0 file others=()
    for file in "${OP_FILES[@]}"; do
        if [ "$file" = tests/test_bias_dropout_add.py ]; then
            "$each" bias_dropout_add $((STAGE_SECONDS / 5)) 1 "$file" || rc=1
        else
            others+=("$file")
        fi
    done
    [ "$each" = pytest_part ] && collections_done
    [ ${#others[@]} -eq 0 ] && return "$rc"
    if [ "$BIG_MEMORY" = 1 ]; then
        "$each" ops_big_memory $((STAGE_SECONDS / 5)) 1 -m big_memory "${others[@]}" || rc=1
        "$each" ops $(($(stage_left) - 20)) "$WORKERS" -m "not big_memory" "${others[@]}" || rc=1
    else
        "$each" ops $(($(stage_left) - 20)) "$WORKERS" "${others[@]}" || rc=1
    fi
    return "$rc"
}

# The parts of suite-rest: every other test file (tests/xla, hooks, runtime tools, the
# scripts' tests), then their big_memory cases in one worker (none today: skipped).
rest_parts() {
    local each=$1 rc=0 file ignore=()
    for file in "${OP_FILES[@]}"; do ignore+=(--ignore "$file"); done
    if [ "$BIG_MEMORY" = 1 ]; then
        "$each" rest $(($(stage_left) - 40)) "$WORKERS" -m "not big_memory" "${ignore[@]}" tests ||
            rc=1
        [ "$each" = pytest_part ] && collections_done
        "$each" rest_big_memory $(($(stage_left) - 20)) 1 -m big_memory "${ignore[@]}" tests ||
            rc=1
    else
        "$each" rest $(($(stage_left) - 20)) "$WORKERS" "${ignore[@]}" tests || rc=1
    fi
    return "$rc"
}

# test: pytest ${PYTEST_ARGS:-tests} on WORKERS workers (none when unset), a junit XML into the
# tarball; SIGINT 15 s before the stage's limit, so that a cut run still prints its summary and
# writes its junit (the stage's own limit kills with SIGTERM: neither).
stage_test() {
    local xdist=() seconds=$((STAGE_SECONDS > 30 ? STAGE_SECONDS - 15 : STAGE_SECONDS / 2))
    [ -n "${WORKERS:-}" ] && xdist=(-n "$WORKERS")
    run mkdir -p "$SCRATCH/junit"
    # shellcheck disable=SC2086 # PYTEST_ARGS: a list of words
    limited "$seconds" "$PY" "${PYTEST[@]}" "${xdist[@]}" --junitxml "$SCRATCH/junit/test.xml" \
        ${PYTEST_ARGS:-tests}
}

# The op files (arguments) that SUITE_OPS selects: its words are glob patterns on the paths,
# those starting with "-" leave files out ("tests/test_window_* tests/test_swin_*": the window
# ops' files; "-tests/test_window_* -tests/test_swin_*": the others); no word to take in: all.
select_op_files() {
    local - file word take
    set -f # the patterns are matched against the op files, not expanded here
    for file in "$@"; do
        take=1
        for word in $SUITE_OPS; do
            [[ "$word" != -* ]] && take=0 && break
        done
        for word in $SUITE_OPS; do
            if [[ "$word" == -* ]]; then
                [[ "$file" == ${word#-} ]] && take=0 && break
            elif [[ "$file" == $word ]]; then
                take=1
            fi
        done
        [ "$take" = 1 ] && echo "$file"
    done
}

# suite-ops, suite-rest: the parts, their collections (all started first, in the background),
# then verified.json from them.
stage_suite() { # ops_parts | rest_parts
    local parts=$1 rc=0
    WORKERS=${WORKERS:-4}
    mapfile -t OP_FILES < <("$PY" benchmarks/record_verified.py --list-op-files)
    if [ ${#OP_FILES[@]} -eq 0 ]; then
        echo "no op test files from benchmarks/record_verified.py --list-op-files"
        return 2
    fi
    if [ "$parts" = ops_parts ] && [ -n "${SUITE_OPS:-}" ]; then
        mapfile -t OP_FILES < <(select_op_files "${OP_FILES[@]}")
        if [ ${#OP_FILES[@]} -eq 0 ]; then
            echo "SUITE_OPS='$SUITE_OPS' selects none of the op test files"
            return 2
        fi
        echo "SUITE_OPS='$SUITE_OPS': ${OP_FILES[*]}"
    fi
    BIG_MEMORY=0
    big_memory_registered && BIG_MEMORY=1
    [ "$BIG_MEMORY" = 0 ] && echo "note: no big_memory marker registered: no big_memory parts"
    run mkdir -p "$SCRATCH/junit" "$SCRATCH/collected"
    PARTS=() COLLECTIONS_SHOWN=0
    "$parts" collect_part
    "$parts" pytest_part || rc=1
    collections_done
    record_verified "${PARTS[@]}"
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
    local others=(window_process swin_softmax window_attention nms quick_gelu layer_norm adam sgd)
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
            "$PY" -m pytest -q -rfE -p no:cacheprovider -p tests.live_failures -p no:xdist \
            --maxfail 5 -o faulthandler_timeout=120 "${select[@]}" "${files[@]}"
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
    test) stage_test ;;
    suite-ops) stage_suite ops_parts ;;
    suite-rest) stage_suite rest_parts ;;
    suite) echo "stage suite is split in two (one device call each): suite-ops, suite-rest" &&
        return 2 ;;
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
    # a warm machine's earlier call: packed then
    rm -rf "$SCRATCH/junit" "$SCRATCH/collected" "$SCRATCH/sanitizer"
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
