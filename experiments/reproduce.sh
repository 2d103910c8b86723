#!/usr/bin/env bash
# Reproduces one experiment end to end: train, average the last checkpoints, choose the beam size
# and length penalty on the validation split, export, and score greedy and beam search on the
# test split (Multi30k's test_2016_flickr, Tatoeba's test) with sacreBLEU (detokenized, cased
# and lowercased) and chrF.
# Usage: bash experiments/reproduce.sh NAME [extra --set ...]
#   NAME: multi30k_de_en | multi30k_en_de | multi30k_en_fr | tatoeba_de_en | ...
#   (experiments/NAME.yaml); the data folder is the config's data.data_dir, else
#   $KERAS_TRANSFORMER_DATA (Tatoeba: KERAS_TRANSFORMER_DATA=../shared/data/tatoeba-deu-eng).
# Environment: RUN (default runs/NAME), AVERAGE (checkpoints averaged, default 5), BEAMS and
# ALPHAS (the validation grid, default 4,5,6 and 0.6,0.8,1.0,1.2,1.4,1.7,2.0: en-de and en-fr
# chose 1.2 and 1.4, the edge of an earlier grid; BEAMS= skips the search and keeps the config's
# decode settings), and
# BUDGET_MINUTES: also score the model as it stood that many minutes after this command started
# (the last AVERAGE epoch checkpoints written by then), for time-to-quality figures of one
# uninterrupted run.
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=${1:?usage: experiments/reproduce.sh NAME [--set section.key=value ...]}
shift
BIN=${BIN:-.venv/bin}
KT="$BIN/keras-transformer"
RUN=${RUN:-runs/$NAME}
AVERAGE=${AVERAGE:-5}
CONFIG=experiments/$NAME.yaml
start=$(date +%s)
"$KT" train --config "$CONFIG" --output "$RUN" --progress 2 "$@"
echo "training wall time: $(( $(date +%s) - start )) s"

# The languages and the validation and test files as the run trained them: its config.yaml is
# the file's resolved with its `base:` and the --set overrides above (such as data.source_lang).
read -r SRC TGT VALID_SRC VALID_TGT TEST_SRC TEST_TGT < <("$BIN/python" -c "
from keras_transformer.config import ExperimentConfig
from keras_transformer.data.corpora import split_files
data = ExperimentConfig.from_yaml('$RUN/config.yaml').data
langs = (data.source_lang, data.target_lang)
files = [split_files(data.resolved_data_dir(), split, langs)
         for split in (data.validation_split, data.test_split)]
print(*langs, *(files[i][lang] for i in (0, 1) for lang in langs))")
TEST=$(basename "$TEST_SRC"); TEST=${TEST%.gz}; TEST=${TEST%.$SRC}

"$KT" average --run "$RUN" --last "$AVERAGE"

# Beam size and alpha: the best validation BLEU of the averaged model (the test split is never
# looked at before the final scores).
BEAMS=${BEAMS-4,5,6}
ALPHAS=${ALPHAS-0.6,0.8,1.0,1.2,1.4,1.7,2.0}
search_flags=()
if [ -n "$BEAMS" ]; then
  "$KT" tune-search --run "$RUN" --weights "$RUN/average_last$AVERAGE.weights.h5" \
    --source "$VALID_SRC" --reference "$VALID_TGT" \
    --beam "$BEAMS" --alpha "$ALPHAS" --workers 2 --output "$RUN/search.json"
  read -r beam alpha < <("$BIN/python" -c \
    "import json; b = json.load(open('$RUN/search.json'))['best']; print(b['beam_size'], b['alpha'])")
  search_flags=(--beam "$beam" --alpha "$alpha")
fi

"$KT" export --run "$RUN" --weights "$RUN/average_last$AVERAGE.weights.h5" "${search_flags[@]}" \
  --output "saved_models/$NAME"
latest_version() { ls -d "saved_models/$NAME"/[0-9]* | sort -t/ -k3 -n | tail -n 1; }
MODEL=$(latest_version)
MODELS=("$MODEL")
if [ -n "${BUDGET_MINUTES:-}" ]; then
  deadline=$(( start + BUDGET_MINUTES * 60 ))
  bound=0
  for checkpoint in "$RUN"/checkpoints/epoch_*.weights.h5; do
    if [ "$(stat -c %Y "$checkpoint")" -le "$deadline" ]; then
      epoch=${checkpoint##*/epoch_}
      bound=$(( 10#${epoch%%.*} ))
    fi
  done
  echo "== $BUDGET_MINUTES minutes after the start: epoch $bound"
  "$KT" average --run "$RUN" --last "$AVERAGE" --upper-bound "$bound"
  "$KT" export --run "$RUN" --weights "$RUN/average_last${AVERAGE}_to$bound.weights.h5" \
    "${search_flags[@]}" --output "saved_models/$NAME"
  MODELS+=("$(latest_version)")
fi

mkdir -p "$RUN/test"
zcat -f "$TEST_SRC" > "$RUN/test/$TEST.$SRC"
zcat -f "$TEST_TGT" > "$RUN/test/$TEST.$TGT"
# Greedy, then the export's serving_default (beam search with the beam and alpha chosen above).
for model in "${MODELS[@]}"; do
  for search in greedy beam; do
    echo "== $NAME $TEST, $search search, $model"
    flags=(); [ "$search" = greedy ] && flags=(--greedy)
    "$KT" evaluate --model "$model" "${flags[@]}" --quiet \
      --source "$RUN/test/$TEST.$SRC" --reference "$RUN/test/$TEST.$TGT" \
      --output "$RUN/test/$TEST.${model##*/}.$search.$TGT"
  done
done
echo "commit $(git rev-parse --short HEAD), command: experiments/reproduce.sh $NAME $*"
