#!/usr/bin/env bash
# Back-translation for Multi30k (issue #70), from one command, for English -> German
# (DIRECTION=en_de, the default) or German -> English (DIRECTION=de_en):
#   1. the opposite direction's model: $BT_RUN if it holds a run, else trained by reproduce.sh;
#   2. the unique Task 2 captions of the target language (multi30k-captions/train.{1..5}.LANG.gz)
#      translated into the source language by it (beam 4 by default: SEARCH=sampling samples),
#      resumable, in $BT/;
#      with MIN_SCORE, MAX_LENGTH_RATIO or MAX_REPEAT, the pairs `keras-transformer filter` keeps
#      (MIN_SCORE: log P / lp of each translation by the model that wrote it, `score`), in
#      $BT/filtered_RULES/;
#   3. the direction trained on the real pairs and the synthetic ones
#      (experiments/multi30k_DIRECTION_bt.yaml), averaged, tuned on validation and scored on
#      test by reproduce.sh;
#   4. with FINETUNE_MINUTES, that model fine-tuned on the real pairs alone for that many minutes
#      (a fresh optimizer and schedule; FINETUNE_LR_SCALE sets its train.learning_rate_scale:
#      0.145, a quarter of the recipe's peak, kept the model where the full peak undid part of
#      it, experiments/RESULTS.md), scored the same way.
# Usage: bash experiments/backtranslate.sh [extra --set ... for step 3]
# Environment: DIRECTION (en_de | de_en), BT_RUN (default runs/multi30k_de_en for en_de,
# runs/multi30k_en_de for de_en), BT_WEIGHTS (its weights, default its average of the last 5,
# else its best), SEARCH (beam | sampling; beam won on validation,
# experiments/RESULTS.md), BT (the folder of the synthetic corpus, default runs/bt_SEARCH for
# en_de, runs/bt_SEARCH_en for de_en), RUN (default runs/multi30k_DIRECTION_bt), REAL_WEIGHT and
# SYNTHETIC_WEIGHT (default 1 and 1), TAG (default <BT>; empty: untagged), FINETUNE_MINUTES
# (default: none), AVERAGE (the checkpoints averaged, as reproduce.sh: English-German chose 15
# on validation, experiments/RESULTS.md), KERAS_TRANSFORMER_DATA (the Multi30k folder; the
# captions are read from multi30k-captions beside it).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${KERAS_TRANSFORMER_DATA:?set KERAS_TRANSFORMER_DATA to the Multi30k folder}"
BIN=${BIN:-.venv/bin}
KT="$BIN/keras-transformer"
DIRECTION=${DIRECTION:-en_de}
case "$DIRECTION" in
  en_de) SOURCE=en TARGET=de ;;
  de_en) SOURCE=de TARGET=en ;;
  *) echo "backtranslate.sh: DIRECTION=$DIRECTION: choose en_de or de_en" >&2; exit 2 ;;
esac
OPPOSITE=${TARGET}_$SOURCE
BT_RUN=${BT_RUN:-runs/multi30k_$OPPOSITE}
SEARCH=${SEARCH:-beam}
default_bt=runs/bt_$SEARCH; [ "$DIRECTION" = de_en ] && default_bt=runs/bt_${SEARCH}_en
BT=${BT:-$default_bt}
RUN=${RUN:-runs/multi30k_${DIRECTION}_bt}
CAPTIONS="$(dirname "$KERAS_TRANSFORMER_DATA")/multi30k-captions"
MONOLINGUAL="$BT/captions.$TARGET"
SYNTHETIC="$BT/captions.${SOURCE}_from_$TARGET"

if [ ! -f "$BT_RUN/config.yaml" ]; then
  echo "== 1. the model of the opposite direction, $OPPOSITE ($BT_RUN)"
  RUN="$BT_RUN" bash experiments/reproduce.sh "multi30k_$OPPOSITE"
fi
if [ -n "${BT_WEIGHTS:-}" ]; then
  if [ ! -f "$BT_WEIGHTS" ]; then
    echo "backtranslate.sh: BT_WEIGHTS=$BT_WEIGHTS: no such file" >&2; exit 2
  fi
  weights=$BT_WEIGHTS
else
  weights="$BT_RUN/average_last5.weights.h5"
  [ -f "$weights" ] || weights=best
fi

echo "== 2. back-translating the captions in $TARGET ($SEARCH, $weights)"
mkdir -p "$BT"
if [ ! -f "$MONOLINGUAL" ]; then
  for i in 1 2 3 4 5; do gzip -dc "$CAPTIONS/train.$i.$TARGET.gz"; done | awk 'NF && !seen[$0]++' \
    > "$MONOLINGUAL.partial"
  mv "$MONOLINGUAL.partial" "$MONOLINGUAL"
fi
flags=(--sampling); [ "$SEARCH" = beam ] && flags=(--beam 4)
start=$(date +%s)
if [ ! -f "$SYNTHETIC" ] || [ -f "$SYNTHETIC.resume.json" ]; then
  "$KT" translate --run "$BT_RUN" --weights "$weights" "${flags[@]}" --workers 2 \
    --source "$MONOLINGUAL" --output "$SYNTHETIC"
fi
echo "back-translation wall time: $(( $(date +%s) - start )) s"

if [ -n "${MIN_SCORE:-}${MAX_LENGTH_RATIO:-}${MAX_REPEAT:-}" ]; then
  echo "== 2b. filtering the synthetic pairs"
  rules=() kept=filtered
  if [ -n "${MIN_SCORE:-}" ]; then
    scores="$SYNTHETIC.scores"  # by the model that wrote them: log P / lp of each translation
    [ -f "$scores" ] || "$KT" score --run "$BT_RUN" --weights "$weights" \
      --source "$MONOLINGUAL" --target "$SYNTHETIC" --output "$scores"
    rules+=(--scores "$scores" --min-score "$MIN_SCORE") kept+=_score$MIN_SCORE
  fi
  if [ -n "${MAX_LENGTH_RATIO:-}" ]; then
    rules+=(--max-length-ratio "$MAX_LENGTH_RATIO") kept+=_ratio$MAX_LENGTH_RATIO
  fi
  if [ -n "${MAX_REPEAT:-}" ]; then
    rules+=(--max-repeat "$MAX_REPEAT") kept+=_repeat$MAX_REPEAT
  fi
  mkdir -p "$BT/$kept"
  "$KT" filter --source "$SYNTHETIC" --target "$MONOLINGUAL" "${rules[@]}" \
    --output-source "$BT/$kept/$(basename "$SYNTHETIC")" \
    --output-target "$BT/$kept/$(basename "$MONOLINGUAL")"
  SYNTHETIC="$BT/$kept/$(basename "$SYNTHETIC")" MONOLINGUAL="$BT/$kept/$(basename "$MONOLINGUAL")"
fi

echo "== 3. $DIRECTION on real and synthetic pairs ($RUN)"
RUN="$RUN" bash experiments/reproduce.sh "multi30k_${DIRECTION}_bt" \
  --set "data.corpora=[{dataset: multi30k, weight: ${REAL_WEIGHT:-1.0}}, {dataset: file_pair, source_file: $SYNTHETIC, target_file: $MONOLINGUAL, weight: ${SYNTHETIC_WEIGHT:-1.0}, tag: ${TAG-<BT>}}]" \
  "$@"

if [ -n "${FINETUNE_MINUTES:-}" ]; then
  echo "== 4. fine-tuning on the real pairs for $FINETUNE_MINUTES minutes"
  RUN="${RUN}_ft" bash experiments/reproduce.sh "multi30k_$DIRECTION" \
    --init-from "$RUN/average_last${AVERAGE:-5}.weights.h5" \
    --set "train.budget_minutes=$FINETUNE_MINUTES" --set "data.vocab_dir=$RUN/vocab" \
    ${FINETUNE_LR_SCALE:+--set "train.learning_rate_scale=$FINETUNE_LR_SCALE"}
fi
