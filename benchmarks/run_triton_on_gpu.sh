#!/usr/bin/env bash
# The fused Triton attention (attn_implementation="xlnet_lite_triton") and SDPA held to cuDNN's kernel, on a GPU machine
# lent for a few minutes, in one command, the parts in the order of what they decide: the kernels' and SDPA's CUDA tests
# (every head against transformers in fp32, a training step's gradients against the explicit kernel, bf16 against fp32,
# the memory, generate(), the model compiled whole; at the bf16 default of 4 warps a tile; the positional term by one
# matmul), then one layer's attention alone at each tile size and warp count, the positional term as the band and by one
# matmul, and through each fused SDPA backend (bench_triton_attention, dropout 0), then `base` at XLNet's pretraining
# shapes at dropout 0: SDPA as the dispatcher runs it and held to cuDNN, the Triton kernels with the band and by one
# matmul, eager; then the matmul's and SDPA's compiled; then each kernel alone at each launch setting and with each term
# changed (bench_triton_kernels); a profile last, if PROFILE_S is set. The tests run 8 at a time (most of their time is
# Triton compiling kernels on the CPU: 14 took 47 s at 4 on an H200 machine's 16 cores). Logs and JSON go to $OUT
# (default gpu_out/, 10 files at most); each part has its own time limit (seconds: TESTS_S, KERNEL_S, BENCH_S,
# COMPILED_S, KERNELS_S, PROFILE_S; the defaults sum to 580).
#
#   bash benchmarks/run_triton_on_gpu.sh
#
# Needs torch with CUDA (and the Triton it brings), transformers, accelerate, pytest (+ pytest-xdist); not datasets.
set -u -o pipefail  # a part's status is its command's, not tee's
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
source "$(dirname "$0")/gpu_env.sh"
python3 -c "import torch, triton, transformers; print(torch.cuda.get_device_name(), '| torch', torch.__version__,
'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), '| triton', triton.__version__,
'| transformers', transformers.__version__)" 2>&1 | tee "$OUT/environment.txt"
workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
timeout "${TESTS_S:-150}" python3 -m pytest -m gpu tests/model/test_gpu.py \
    -k "xlnet_lite_triton or triton_kernels or sdpa" -rA -p no:cacheprovider $workers 2>&1 \
    | tee "$OUT/pytest_gpu_triton.log"
echo "tests: exit ${PIPESTATUS[0]}" | tee -a "$OUT/pytest_gpu_triton.log"
timeout "${KERNEL_S:-70}" python3 -m benchmarks.bench_triton_attention --dropout 0 \
    --out "$OUT/triton_attention_base_dropout0.json" 2>&1 | tee "$OUT/bench_triton_attention.log"
timeout "${BENCH_S:-100}" python3 -m benchmarks.bench_gpu --config base --variants lite_sdpa_nodrop_bf16 \
    lite_sdpa_cudnn_nodrop_bf16 lite_triton_nodrop_bf16 lite_triton_matmul_nodrop_bf16 \
    --out "$OUT/model_base_triton.json" 2>&1 | tee "$OUT/bench_triton.log"
echo "benchmark: exit ${PIPESTATUS[0]}" | tee -a "$OUT/bench_triton.log"
timeout "${COMPILED_S:-200}" python3 -m benchmarks.bench_gpu --config base --variants \
    lite_triton_matmul_compiled_nodrop_bf16 lite_compiled_nodrop_bf16 --out "$OUT/model_base_triton_compiled.json" \
    2>&1 | tee -a "$OUT/bench_triton.log"
echo "compiled benchmark: exit ${PIPESTATUS[0]}" | tee -a "$OUT/bench_triton.log"
timeout "${KERNELS_S:-60}" python3 -m benchmarks.bench_triton_kernels --out "$OUT/triton_kernels_base.json" 2>&1 \
    | tee "$OUT/bench_triton_kernels.log"
if [ "${PROFILE_S:-0}" -gt 0 ]; then
    timeout "$PROFILE_S" python3 -m benchmarks.profile_gpu --config base --variant lite_triton_nodrop_bf16 --steps 2 \
        --shapes --rows 30 --out "$OUT/profile_base_lite_triton_nodrop_bf16.txt" 2>&1 | tail -5
fi
