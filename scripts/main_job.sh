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
#   bash scripts/main_job.sh [--overwrite_output_dir] [--pretraining_steps N]
# --overwrite_output_dir replaces the outputs of an earlier main job; --pretraining_steps N pretrains for N steps
# instead of 10 minutes: the same steps as a timed run that reached N (the comparison prints N), bit-identical on the
# same machine and precision.
# Results: outputs/pretrain/ (model, loss.png, results.json), outputs/newsgroups/{pretrained,random_init}/ (the
# classifiers), outputs/newsgroups/tfidf.json, and outputs/comparison.json (the table this script ends with).
set -euo pipefail
cd "$(dirname "$0")/.."
OVERWRITE=""
TIMED_BUDGET="--max_train_minutes 10"
PRETRAINING_BUDGET="$TIMED_BUDGET"
while [ $# -gt 0 ]; do
  case "$1" in
    --overwrite_output_dir) OVERWRITE="--overwrite_output_dir"; shift ;;
    --pretraining_steps)
      # at least the recipe's 100 warmup steps
      if [ $# -lt 2 ] || ! [[ "$2" =~ ^[1-9][0-9]*$ ]] || [ "$2" -lt 100 ]; then
        echo "main_job.sh: error: --pretraining_steps needs a whole number of steps, at least the 100 warmup steps, got ${2-nothing}" >&2
        exit 2
      fi
      PRETRAINING_BUDGET="--max_steps $2"; shift 2 ;;
    *)
      echo "main_job.sh: error: unknown argument $1 (the arguments are --overwrite_output_dir and --pretraining_steps N; run the recipes themselves for other flags)" >&2
      exit 2 ;;
  esac
done
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
if [ "$PRETRAINING_BUDGET" = "$TIMED_BUDGET" ] &&
   [ "$(python -c 'import xlnet_lite.precision as p; print(p.fast_bf16("cpu")[0])' 2>/dev/null)" = "False" ]; then
  echo "main_job.sh: note: this CPU has no AMX or AVX512-BF16, so the job runs in fp32: about 30 minutes on 2 cores," \
       "and 10 minutes of pretraining reach about 1.2M tokens there, short of the ~1.5M where pretraining starts to pay" \
       "on this task (benchmarks/RESULTS.md, \"CPU without bf16 units\"); --pretraining_steps 3060 takes the README's run's" \
       "6.3M tokens (about 50 minutes of fp32 steps there)" >&2
fi
LABELS_PER_CLASS=50
LAUNCH=(accelerate launch --cpu --num_processes 1 --num_machines 1 --num_cpu_threads_per_process "$OMP_NUM_THREADS"
        --dynamo_backend no)
FINETUNE=(finetune/run_glue.py --embedded_task newsgroups --max_train_samples_per_class "$LABELS_PER_CLASS"
          --num_train_epochs 8 --eval_strategy no --checkpointing_steps 0 $OVERWRITE)
"${LAUNCH[@]}" pretrain/run_pretraining.py --embedded_corpus newsgroups $PRETRAINING_BUDGET $OVERWRITE
"${LAUNCH[@]}" "${FINETUNE[@]}" --model_name_or_path outputs/pretrain --output_dir outputs/newsgroups/pretrained
"${LAUNCH[@]}" "${FINETUNE[@]}" --config_name outputs/pretrain --output_dir outputs/newsgroups/random_init
python -m main_job.tfidf --embedded_task newsgroups --max_train_samples_per_class "$LABELS_PER_CLASS" \
  --out outputs/newsgroups/tfidf.json > /dev/null
python -m main_job.compare outputs/newsgroups --pretraining outputs/pretrain --out outputs/comparison.json
