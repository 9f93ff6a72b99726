#!/usr/bin/env bash
# Run every experiment sweep in turn, each into its own store under RUNS (default runs/; stores are not
# committed), appending its JSON events to RUNS/<store>.jsonl. Sweeps resume: re-running this script
# continues where it stopped, skipping finished trials. Then measure the predictors of the critical
# batch size against each store (batchlab predict, and B_simple across one reference run with
# batchlab probe noise-scale) into experiments/predictions/<store>/, and write each store's report
# (with the NQM prediction and those predictions) and its CSV into experiments/reports/<store>/.
# Then refit every committed report with the current statistics (`refits`: its steps table, made from
# its CSV by experiments/steps_tables.py, fitted by `batchlab analyze critical-batch-size --steps-table`
# into experiments/reports/<store>/refit.{txt,jsonl}; no store needed) and score every predictor on its
# own against those refits (`scores`: experiments/predictions/scores.{txt,jsonl}).
#   OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE bash experiments/run_all.sh [sweeps|predictions|reports|refits|scores]
# A prediction file that exists is kept (delete it to measure again).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" OMP_WAIT_POLICY=PASSIVE MPLBACKEND=Agg
BATCHLAB="${BATCHLAB:-.venv/bin/batchlab}"
RUNS="${RUNS:-runs}"
WHAT="${1:-all}"
# config (experiments/<config>.toml) and store (RUNS/<store>), in the order they run
EXPERIMENTS=(
  "fc128_sgd_momentum_race fc128_race"
  "fc64_optimizers_race fc64_optimizers"
  "cnn_tiny_race cnn_tiny"
  "lstm_char_race lstm_char"
  "fc64_ema_race fc64_ema"
)
# store, workload, optimizers predicted, reference-run steps at which B_simple is measured, and any
# further options of `batchlab predict` (the LSTM: 256 probe examples, since its per-example gradients
# and curvature products go through torch's slow fallbacks for the CPU LSTM kernel: 18 minutes here)
PREDICTIONS=(
  "fc128_race mnist/fc_128_128_128 sgd,momentum 0,30,100,300,750,1500,3000"
  "fc64_optimizers mnist/fc_64_64_64 sgd,momentum,adam 0,30,100,300,750,1500,3000"
  "cnn_tiny experiments/workloads.py:mnist_simple_cnn_tiny momentum,adam 0,40,130,400,1000,2000,4000"
  "lstm_char shakespeare/lstm_char adam 0,10,30,100,250,500,1000 --examples 256"
)
mkdir -p "$RUNS"
if [[ "$WHAT" == all || "$WHAT" == sweeps ]]; then
  for pair in "${EXPERIMENTS[@]}"; do
    read -r config store <<<"$pair"
    echo "== sweep $config -> $RUNS/$store"
    nice $BATCHLAB sweep --config "experiments/$config.toml" --store "$RUNS/$store" --json >>"$RUNS/$store.jsonl"
  done
fi
if [[ "$WHAT" == all || "$WHAT" == predictions ]]; then
  for entry in "${PREDICTIONS[@]}"; do
    read -r store workload optimizers steps options <<<"$entry"
    [[ -d "$RUNS/$store" ]] || continue
    out="experiments/predictions/$store"
    mkdir -p "$out"
    for optimizer in ${optimizers//,/ }; do
      if [[ ! -s "$out/predict_$optimizer.jsonl" ]]; then
        echo "== predict $workload $optimizer against $RUNS/$store"
        if nice $BATCHLAB predict "$workload" --optimizer "$optimizer" --store "$RUNS/$store" ${options:-} --json >"$out/predict_$optimizer.jsonl.tmp"; then
          mv "$out/predict_$optimizer.jsonl.tmp" "$out/predict_$optimizer.jsonl"
        else  # e.g. no trials of this optimizer in the store yet: its error line is above
          rm -f "$out/predict_$optimizer.jsonl.tmp"
        fi
      fi
      if [[ ! -s "$out/noise_scale_$optimizer.jsonl" ]]; then
        echo "== B_simple across training: $workload $optimizer at steps $steps"
        nice $BATCHLAB probe noise-scale "$workload" --optimizer "$optimizer" --steps-at "$steps" --json >"$out/noise_scale_$optimizer.jsonl.tmp"
        mv "$out/noise_scale_$optimizer.jsonl.tmp" "$out/noise_scale_$optimizer.jsonl"
      fi
    done
  done
fi
if [[ "$WHAT" == all || "$WHAT" == reports ]]; then
  for pair in "${EXPERIMENTS[@]}"; do
    read -r config store <<<"$pair"
    [[ -d "$RUNS/$store" ]] || continue
    mkdir -p "experiments/reports/$store"
    predictions=()
    for file in experiments/predictions/"$store"/*.jsonl; do
      [[ -e "$file" ]] && predictions+=(--predictions "$file")
    done
    echo "== report $RUNS/$store -> experiments/reports/$store/report.html"
    $BATCHLAB report --store "$RUNS/$store" --out "experiments/reports/$store/report.html" --nqm "${predictions[@]}"
  done
fi
if [[ "$WHAT" == all || "$WHAT" == refits ]]; then
  .venv/bin/python experiments/steps_tables.py
  for pair in "${EXPERIMENTS[@]}"; do
    read -r config store <<<"$pair"
    table="experiments/reports/$store/steps.csv"
    [[ -s "$table" ]] || continue
    echo "== refit $table -> experiments/reports/$store/refit.txt, refit.jsonl"
    COLUMNS=400 $BATCHLAB analyze critical-batch-size --steps-table "$table" --group-by unit >"experiments/reports/$store/refit.txt.tmp"
    $BATCHLAB analyze critical-batch-size --steps-table "$table" --group-by unit --json >"experiments/reports/$store/refit.jsonl.tmp"
    mv "experiments/reports/$store/refit.txt.tmp" "experiments/reports/$store/refit.txt"
    mv "experiments/reports/$store/refit.jsonl.tmp" "experiments/reports/$store/refit.jsonl"
  done
fi
if [[ "$WHAT" == all || "$WHAT" == scores ]]; then
  measured=()
  for file in experiments/reports/*/refit.jsonl; do
    [[ -e "$file" ]] && measured+=(--measured "$file")
  done
  echo "== scores of experiments/predictions/*/predict_*.jsonl against the refits -> experiments/predictions/scores.txt, scores.jsonl"
  COLUMNS=200 $BATCHLAB predict --score experiments/predictions/*/predict_*.jsonl "${measured[@]}" \
    --workload-ref experiments/workloads.py:mnist_simple_cnn_tiny >experiments/predictions/scores.txt.tmp
  $BATCHLAB predict --score experiments/predictions/*/predict_*.jsonl "${measured[@]}" \
    --workload-ref experiments/workloads.py:mnist_simple_cnn_tiny --json >experiments/predictions/scores.jsonl.tmp
  mv experiments/predictions/scores.txt.tmp experiments/predictions/scores.txt
  mv experiments/predictions/scores.jsonl.tmp experiments/predictions/scores.jsonl
fi
