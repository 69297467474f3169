#!/usr/bin/env bash
# Download the benchmark-only peer libraries (pure-Python wheels; never dependencies of
# fusedops) into .whl/ for the GPU machine, which has no network: carry ".whl" with the device
# call and gpu_check.sh installs them into /tmp/site (--no-deps: the machine's own torch and
# triton stay). Peers: Liger-Kernel (bench_layer_norm's "liger" rows).
#
#   bash benchmarks/fetch_peers.sh        # then run gpu_check.sh with carry [".whl"]
set -euo pipefail
cd "$(dirname "$0")/.."
LIGER="${LIGER_VERSION:-0.8.5}"
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl "liger-kernel==$LIGER"
ls -l .whl
