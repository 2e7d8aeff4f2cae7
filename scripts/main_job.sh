#!/usr/bin/env bash
# The main job, on 20 Newsgroups: pretrain XLNet-Lite on the training split's own text (no validation or test
# message), finetune it with 50 labelled messages per group, and compare it with the same architecture from random
# initialisation (same tokenizer, same finetuning budget) and with TF-IDF + logistic regression on the same 50 messages
# per group. The recipes run with their defaults except the data flags and the budget: 10 minutes of pretraining steps
# (--max_train_minutes; the tokenizer, the token store and evaluation come on top), so a faster machine buys more
# tokens (benchmarks/RESULTS.md, "Main job" and "CPU without bf16 units"); and 8 finetuning epochs keeping the last
# epoch's model, the validation split scored once at the end (--eval_strategy no: the last epoch scores within a
# point of the best, RESULTS.md "Main job"). Both arms finetune at the recipe's default learning rate, 3e-4, the
# best of 1e-4 / 3e-4 / 1e-3 on validation for each (benchmarks/RESULTS.md, "The levers").
#   bash scripts/main_job.sh [--overwrite_output_dir] [--pretraining_steps N] [--cpu]
# --overwrite_output_dir replaces the outputs of an earlier main job; --pretraining_steps N pretrains for N steps
# instead of 10 minutes: the same steps as a timed run that reached N (the comparison prints N), bit-identical on the
# same machine and precision. The recipes run on the GPU where torch sees one (bf16 where it supports it), else on
# the CPU with OMP_NUM_THREADS threads (default 2); --cpu keeps them on the CPU (python -m main_job.launch).
# Results: outputs/pretrain/ (model, loss.png, results.json), outputs/newsgroups/{pretrained,random_init}/ (the
# classifiers), outputs/newsgroups/tfidf.json, and outputs/comparison.json (the table this script ends with).
set -euo pipefail
cd "$(dirname "$0")/.."
OVERWRITE=""
FORCE_CPU=""
TIMED_BUDGET="--max_train_minutes 10"
PRETRAINING_BUDGET="$TIMED_BUDGET"
while [ $# -gt 0 ]; do
  case "$1" in
    --overwrite_output_dir) OVERWRITE="--overwrite_output_dir"; shift ;;
    --cpu) FORCE_CPU="--cpu"; shift ;;
    --pretraining_steps)
      # at least the recipe's 100 warmup steps
      if [ $# -lt 2 ] || ! [[ "$2" =~ ^[1-9][0-9]*$ ]] || [ "$2" -lt 100 ]; then
        echo "main_job.sh: error: --pretraining_steps needs a whole number of steps, at least the 100 warmup steps, got ${2-nothing}" >&2
        exit 2
      fi
      PRETRAINING_BUDGET="--max_steps $2"; shift 2 ;;
    *)
      echo "main_job.sh: error: unknown argument $1 (the arguments are --overwrite_output_dir, --pretraining_steps N and --cpu; run the recipes themselves for other flags)" >&2
      exit 2 ;;
  esac
done
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
if ! [[ "$OMP_NUM_THREADS" =~ ^[1-9][0-9]*$ ]]; then
  echo "main_job.sh: error: OMP_NUM_THREADS must be a whole number of threads, got $OMP_NUM_THREADS" >&2
  exit 2
fi
TIMED=""
[ "$PRETRAINING_BUDGET" = "$TIMED_BUDGET" ] && TIMED="--timed"  # a CPU without bf16 units gets a note on what it buys
LAUNCH_LINE=$(python -m main_job.launch $FORCE_CPU --threads "$OMP_NUM_THREADS" $TIMED)
read -r -a LAUNCH <<< "$LAUNCH_LINE"  # accelerate launch ... on the GPU, or on the CPU with the threads
if [ "${LAUNCH[0]:-}" != accelerate ]; then
  echo "main_job.sh: error: python -m main_job.launch printed no accelerate command: $LAUNCH_LINE" >&2
  exit 1
fi
LABELS_PER_CLASS=50
FINETUNE=(finetune/run_glue.py --embedded_task newsgroups --max_train_samples_per_class "$LABELS_PER_CLASS"
          --num_train_epochs 8 --eval_strategy no --checkpointing_steps 0 $OVERWRITE)
"${LAUNCH[@]}" pretrain/run_pretraining.py --embedded_corpus newsgroups $PRETRAINING_BUDGET $OVERWRITE
"${LAUNCH[@]}" "${FINETUNE[@]}" --model_name_or_path outputs/pretrain --output_dir outputs/newsgroups/pretrained
"${LAUNCH[@]}" "${FINETUNE[@]}" --config_name outputs/pretrain --output_dir outputs/newsgroups/random_init
python -m main_job.tfidf --embedded_task newsgroups --max_train_samples_per_class "$LABELS_PER_CLASS" \
  --out outputs/newsgroups/tfidf.json > /dev/null
python -m main_job.compare outputs/newsgroups --pretraining outputs/pretrain --out outputs/comparison.json
