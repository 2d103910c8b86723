#!/usr/bin/env bash
# The main job at a size a newcomer can wait for: train the tutorial preset on Multi30k
# German-English and watch the loss fall. Usage: bash experiments/demo.sh [extra --set ...]
set -euo pipefail
cd "$(dirname "$0")/.."
: "${KERAS_TRANSFORMER_DATA:?set KERAS_TRANSFORMER_DATA to the Multi30k folder (e.g. ../shared/data/multi30k)}"
BIN=${BIN:-.venv/bin}
RUN=${RUN:-runs/demo}

"$BIN/keras-transformer" train --config experiments/demo.yaml --output "$RUN" --verbose 2 "$@"
