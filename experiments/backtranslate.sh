#!/usr/bin/env bash
# Back-translation for Multi30k English -> German (issue #70), from one command:
#   1. the German-English model: $BT_RUN if it holds a run, else trained by reproduce.sh;
#   2. the unique German Task 2 captions (multi30k-captions/train.{1..5}.de.gz) translated into
#      English by it (beam 4 by default: SEARCH=sampling samples), resumable, in runs/bt_beam/;
#   3. English -> German trained on the real pairs and the synthetic ones
#      (experiments/multi30k_en_de_bt.yaml), averaged, tuned on validation and scored on test by
#      reproduce.sh;
#   4. with FINETUNE_MINUTES, that model fine-tuned on the real pairs alone for that many minutes
#      (a fresh optimizer and schedule), scored the same way.
# Usage: bash experiments/backtranslate.sh [extra --set ... for step 3]
# Environment: BT_RUN (default runs/multi30k_de_en), SEARCH (beam | sampling; beam won on
# validation, experiments/RESULTS.md), BT (the folder of the synthetic corpus, default
# runs/bt_SEARCH), RUN (default runs/multi30k_en_de_bt),
# FINETUNE_MINUTES (default: none), KERAS_TRANSFORMER_DATA (the Multi30k folder; the captions
# are read from multi30k-captions beside it).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${KERAS_TRANSFORMER_DATA:?set KERAS_TRANSFORMER_DATA to the Multi30k folder}"
BIN=${BIN:-.venv/bin}
KT="$BIN/keras-transformer"
BT_RUN=${BT_RUN:-runs/multi30k_de_en}
SEARCH=${SEARCH:-beam}
BT=${BT:-runs/bt_$SEARCH}
RUN=${RUN:-runs/multi30k_en_de_bt}
CAPTIONS="$(dirname "$KERAS_TRANSFORMER_DATA")/multi30k-captions"

if [ ! -f "$BT_RUN/config.yaml" ]; then
  echo "== 1. the German-English model ($BT_RUN)"
  RUN="$BT_RUN" bash experiments/reproduce.sh multi30k_de_en
fi
weights="$BT_RUN/average_last5.weights.h5"
[ -f "$weights" ] || weights=best

echo "== 2. back-translating the German captions ($SEARCH, $weights)"
mkdir -p "$BT"
if [ ! -f "$BT/captions.de" ]; then
  for i in 1 2 3 4 5; do gzip -dc "$CAPTIONS/train.$i.de.gz"; done | awk 'NF && !seen[$0]++' \
    > "$BT/captions.de.partial"
  mv "$BT/captions.de.partial" "$BT/captions.de"
fi
flags=(--sampling); [ "$SEARCH" = beam ] && flags=(--beam 4)
start=$(date +%s)
if [ ! -f "$BT/captions.en_from_de" ] || [ -f "$BT/captions.en_from_de.resume.json" ]; then
  "$KT" translate --run "$BT_RUN" --weights "$weights" "${flags[@]}" --workers 2 \
    --source "$BT/captions.de" --output "$BT/captions.en_from_de"
fi
echo "back-translation wall time: $(( $(date +%s) - start )) s"

echo "== 3. English -> German on real and synthetic pairs ($RUN)"
RUN="$RUN" bash experiments/reproduce.sh multi30k_en_de_bt \
  --set "data.corpora=[{dataset: multi30k, weight: ${REAL_WEIGHT:-1.0}}, {dataset: file_pair, source_file: $BT/captions.en_from_de, target_file: $BT/captions.de, weight: ${SYNTHETIC_WEIGHT:-1.0}, tag: ${TAG-<BT>}}]" \
  "$@"

if [ -n "${FINETUNE_MINUTES:-}" ]; then
  echo "== 4. fine-tuning on the real pairs for $FINETUNE_MINUTES minutes"
  RUN="${RUN}_ft" bash experiments/reproduce.sh multi30k_en_de \
    --init-from "$RUN/average_last5.weights.h5" --set "train.budget_minutes=$FINETUNE_MINUTES" \
    --set "data.vocab_dir=$RUN/vocab"
fi
