#!/usr/bin/env bash
# The main job: pretrain XLNet-Lite on the embedded news (without the news-topic task's validation and test
# articles), then finetune it on the in-domain task (an article's topic) and compare it with the same architecture
# from random initialisation (same tokenizer, same finetuning budget) and with TF-IDF + logistic regression.
#   bash scripts/main_job.sh [--overwrite_output_dir]      (the flag replaces the outputs of an earlier main job)
# Results: outputs/pretrain/ (model, loss.png, results.json), outputs/news_topic/{pretrained,random_init}/ (the
# classifiers), outputs/news_topic/comparison.json (the table this script ends with).
set -euo pipefail
cd "$(dirname "$0")/.."
for arg in "$@"; do
  if [ "$arg" != "--overwrite_output_dir" ]; then
    echo "main_job.sh: error: unknown argument $arg (the only one is --overwrite_output_dir; run the recipes themselves for other flags)" >&2
    exit 2
  fi
done
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
LAUNCH=(accelerate launch --cpu --num_processes 1 --num_machines 1 --num_cpu_threads_per_process "$OMP_NUM_THREADS"
        --dynamo_backend no --mixed_precision no)
FINETUNE=(finetune/run_glue.py --embedded_task news_topic --num_train_epochs 3 --learning_rate 3e-4 --max_seq_length 128
          --checkpointing_steps 0 "$@")
"${LAUNCH[@]}" pretrain/run_pretraining.py "$@"
"${LAUNCH[@]}" "${FINETUNE[@]}" --model_name_or_path outputs/pretrain --output_dir outputs/news_topic/pretrained
"${LAUNCH[@]}" "${FINETUNE[@]}" --config_name outputs/pretrain --output_dir outputs/news_topic/random_init
python -m benchmarks.baselines.tfidf --embedded_task news_topic --out outputs/news_topic/tfidf.json > /dev/null
python -m benchmarks.compare_init outputs/news_topic --out outputs/news_topic/comparison.json
