#!/usr/bin/env bash
# The main job, on 20 Newsgroups: pretrain XLNet-Lite on the training split's own text (no validation or test
# message), finetune it with 50 labelled messages per group, and compare it with the same architecture from random
# initialisation (same tokenizer, same finetuning budget) and with TF-IDF + logistic regression on the same 50 messages
# per group. The recipes run with their defaults except the data flags and the budget: 600 pretraining steps, and 8
# finetuning epochs (at 4 the random arm was still improving) keeping the last epoch's model, the validation split
# scored once at the end (--eval_strategy no; over 35 benchmark runs with these flags the last epoch scored within
# 0.8 points of the best on validation, 0.16 on average). Both arms finetune at the recipe's default learning rate,
# 3e-4: the best of the grid 1e-4 / 3e-4 / 1e-3 on validation for each (benchmarks/RESULTS.md). About 9 minutes in
# bf16 on a 2-core CPU with AMX; in fp32 on a 2-core AVX2-only CPU 23-28 with the former pretraining defaults, whose
# steps took 1/1.2 the time of today's there (about 1.7 minutes less).
#   bash scripts/main_job.sh [--overwrite_output_dir]      (the flag replaces the outputs of an earlier main job)
# Results: outputs/pretrain/ (model, loss.png, results.json), outputs/newsgroups/{pretrained,random_init}/ (the
# classifiers), outputs/newsgroups/tfidf.json, and outputs/comparison.json (the table this script ends with).
set -euo pipefail
cd "$(dirname "$0")/.."
for arg in "$@"; do
  if [ "$arg" != "--overwrite_output_dir" ]; then
    echo "main_job.sh: error: unknown argument $arg (the only one is --overwrite_output_dir; run the recipes themselves for other flags)" >&2
    exit 2
  fi
done
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
LABELS_PER_CLASS=50
LAUNCH=(accelerate launch --cpu --num_processes 1 --num_machines 1 --num_cpu_threads_per_process "$OMP_NUM_THREADS"
        --dynamo_backend no)
FINETUNE=(finetune/run_glue.py --embedded_task newsgroups --max_train_samples_per_class "$LABELS_PER_CLASS"
          --num_train_epochs 8 --eval_strategy no --checkpointing_steps 0 "$@")
"${LAUNCH[@]}" pretrain/run_pretraining.py --embedded_corpus newsgroups --max_steps 600 "$@"
"${LAUNCH[@]}" "${FINETUNE[@]}" --model_name_or_path outputs/pretrain --output_dir outputs/newsgroups/pretrained
"${LAUNCH[@]}" "${FINETUNE[@]}" --config_name outputs/pretrain --output_dir outputs/newsgroups/random_init
python -m benchmarks.baselines.tfidf --embedded_task newsgroups --max_train_samples_per_class "$LABELS_PER_CLASS" \
  --out outputs/newsgroups/tfidf.json > /dev/null
python -m benchmarks.compare_init outputs/newsgroups --pretraining outputs/pretrain --out outputs/comparison.json
