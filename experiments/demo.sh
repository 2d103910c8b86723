#!/usr/bin/env bash
# The main job at a size a newcomer can wait for: train the tutorial preset on Multi30k
# German-English, export it as a SavedModel, translate a few test sentences with it and score
# the whole test split with sacreBLEU. Usage: bash experiments/demo.sh [extra --set ...]
set -euo pipefail
cd "$(dirname "$0")/.."
: "${KERAS_TRANSFORMER_DATA:?set KERAS_TRANSFORMER_DATA to the Multi30k folder (e.g. ../shared/data/multi30k)}"
BIN=${BIN:-.venv/bin}
RUN=${RUN:-runs/demo}
EXPORT=${EXPORT:-saved_models/demo}
KT="$BIN/keras-transformer"

echo "== 1. train (watch the loss fall; TensorBoard: $BIN/tensorboard --logdir $RUN/logs)"
"$KT" train --config experiments/demo.yaml --output "$RUN" --progress 2 "$@"

echo "== 2. export a SavedModel for TF Serving"
"$KT" export --run "$RUN" --output "$EXPORT"
MODEL=$(ls -d "$EXPORT"/[0-9]* | sort -t/ -k3 -n | tail -n 1)

echo "== 3. translate with the exported model ($MODEL)"
mkdir -p "$RUN/test"
for lang in de en; do
  gzip -dc "$KERAS_TRANSFORMER_DATA/test_2016_flickr.$lang.gz" > "$RUN/test/test_2016_flickr.$lang"
done
head -n 5 "$RUN/test/test_2016_flickr.de" > "$RUN/test/sample.de"
"$KT" translate --model "$MODEL" --quiet < "$RUN/test/sample.de" > "$RUN/test/sample.en"
paste -d '\n' "$RUN/test/sample.de" "$RUN/test/sample.en" | sed 'n;s/^/  -> /'

echo "== 4. sacreBLEU on test_2016_flickr (1000 sentences, beam search)"
"$KT" evaluate --model "$MODEL" --source "$RUN/test/test_2016_flickr.de" \
  --reference "$RUN/test/test_2016_flickr.en" --output "$RUN/test/test_2016_flickr.hyp.en"
