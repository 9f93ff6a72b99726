#!/usr/bin/env bash
# Run every experiment sweep in turn, each into its own store under RUNS (default runs/; stores are not
# committed), appending its JSON events to RUNS/<store>.jsonl. Sweeps resume: re-running this script
# continues where it stopped, skipping finished trials. Then write each store's report (with the NQM
# prediction) and its summary CSV into experiments/reports/<store>/.
#   OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE bash experiments/run_all.sh [sweeps|reports]
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
  "fc64_ema_race fc64_ema"
  "cnn_tiny_race cnn_tiny"
  "lstm_char_race lstm_char"
)
mkdir -p "$RUNS"
if [[ "$WHAT" == all || "$WHAT" == sweeps ]]; then
  for pair in "${EXPERIMENTS[@]}"; do
    read -r config store <<<"$pair"
    echo "== sweep $config -> $RUNS/$store"
    nice $BATCHLAB sweep --config "experiments/$config.toml" --store "$RUNS/$store" --json >>"$RUNS/$store.jsonl"
  done
fi
if [[ "$WHAT" == all || "$WHAT" == reports ]]; then
  for pair in "${EXPERIMENTS[@]}"; do
    read -r config store <<<"$pair"
    [[ -d "$RUNS/$store" ]] || continue
    mkdir -p "experiments/reports/$store"
    echo "== report $RUNS/$store -> experiments/reports/$store/report.html"
    $BATCHLAB report --store "$RUNS/$store" --out "experiments/reports/$store/report.html" --nqm
  done
fi
