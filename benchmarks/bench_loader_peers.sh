#!/usr/bin/env bash
# The loader's peers (MosaicML streaming, LitData) in their own environment: they pin other torch builds.
#
#   benchmarks/bench_loader_peers.sh --corpus /tmp/bench-loader-corpus --steps 2000     # see bench_loader.py
#
# Creates $PEERS_VENV (default /tmp/peers-venv) once: the CPU build of torch first, then the peers with
# torch and torchvision pinned. Both peers require torchvision, whose newest release requires a newer torch,
# and pip then pulls a CUDA torch with ~5 GB of nvidia-* wheels; torchvision 0.28.0 goes with torch 2.13.
# About 2 GB on disk. Then runs benchmarks/bench_loader_peers.py with the arguments given.
set -euo pipefail
VENV=${PEERS_VENV:-/tmp/peers-venv}
HERE=$(cd "$(dirname "$0")" && pwd)
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import streaming, litdata" 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q "torch==2.13.0"
    printf 'torch==2.13.0\ntorchvision==0.28.0\n' > "$VENV/constraints.txt"
    "$VENV/bin/python" -m pip install -q -c "$VENV/constraints.txt" mosaicml-streaming litdata pyarrow numpy
    # PyPI's torchvision is linked against CUDA torch (libc10_cuda.so) and fails to load with the CPU build,
    # and the CPU torchvision lives only on download.pytorch.org. Neither peer uses it for token streams
    # (streaming imports two names from it for its vision datasets), so a two-name shim replaces it.
    "$VENV/bin/python" -m pip uninstall -q -y torchvision
    SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    mkdir -p "$SITE/torchvision/datasets" "$SITE/torchvision/transforms"
    echo '"""Shim from bench_loader_peers.sh: not torchvision."""' > "$SITE/torchvision/__init__.py"
    printf 'class VisionDataset:\n    pass\n' > "$SITE/torchvision/datasets/__init__.py"
    : > "$SITE/torchvision/transforms/__init__.py"
    printf 'def to_tensor(x):\n    raise NotImplementedError("torchvision shim")\n' \
        > "$SITE/torchvision/transforms/functional.py"
fi
MARIN_PYTHON=$HERE/../.venv/bin/python  # marin's loader is timed in the same run, from its own venv
exec "$VENV/bin/python" "$HERE/bench_loader_peers.py" --marin-python "$MARIN_PYTHON" "$@"
