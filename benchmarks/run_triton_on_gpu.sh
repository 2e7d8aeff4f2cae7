#!/usr/bin/env bash
# The fused Triton attention (attn_implementation="xlnet_lite_triton") on a GPU machine lent for a few minutes, in one
# command: its CUDA tests (every head against transformers in fp32, a training step's gradients against the explicit
# kernel, bf16 against fp32, the memory, generate()), then the attention alone at each tile size and warp count
# against the SDPA path's work (bench_triton_attention, dropout 0 and 0.1), then `base` at XLNet's pretraining shapes
# beside SDPA eager (dropout 0.1, as transformers' row, and 0) and beside the best compiled row measured (the explicit
# kernel compiled, 19.3% MFU), then a profile of its training step. Logs and JSON go to $OUT (default
# gpu_out/); each part has its own time limit (seconds: TESTS_S, BENCH_S, KERNEL_S, PROFILE_S).
#
#   bash benchmarks/run_triton_on_gpu.sh
#
# Needs torch with CUDA (and the Triton it brings), transformers, accelerate, pytest (+ pytest-xdist); not datasets.
set -u -o pipefail  # a part's status is its command's, not tee's
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
source "$(dirname "$0")/gpu_env.sh"
python3 -c "import torch, triton, transformers; print(torch.cuda.get_device_name(), '| torch', torch.__version__,
'cuda', torch.version.cuda, '| triton', triton.__version__, '| transformers', transformers.__version__)" \
    2>&1 | tee "$OUT/environment.txt"
workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4")
timeout "${TESTS_S:-200}" python3 -m pytest -m gpu tests/test_gpu.py -k "xlnet_lite_triton or triton_kernels" -rA \
    -p no:cacheprovider $workers 2>&1 | tee "$OUT/pytest_gpu_triton.log"
echo "tests: exit ${PIPESTATUS[0]}" | tee -a "$OUT/pytest_gpu_triton.log"
for dropout in 0 0.1; do  # the attention alone, one layer's content stream, at each tile size and warp count
    timeout "${KERNEL_S:-60}" python3 -m benchmarks.bench_triton_attention --dropout $dropout \
        --out "$OUT/triton_attention_base_dropout$dropout.json" 2>&1 | tee -a "$OUT/bench_triton_attention.log"
done
timeout "${BENCH_S:-240}" python3 -m benchmarks.bench_gpu --config base --variants lite_triton_bf16 lite_sdpa_bf16 \
    lite_triton_nodrop_bf16 lite_sdpa_nodrop_bf16 lite_triton_compiled_bf16 lite_eager_compiled_bf16 \
    --out "$OUT/model_base_triton.json" 2>&1 | tee "$OUT/bench_triton.log"
echo "benchmark: exit ${PIPESTATUS[0]}" | tee -a "$OUT/bench_triton.log"
timeout "${PROFILE_S:-90}" python3 -m benchmarks.profile_gpu --config base --variant lite_triton_bf16 --steps 2 \
    --rows 30 --out "$OUT/profile_base_lite_triton_bf16.txt" 2>&1 | tail -5
