#!/usr/bin/env bash
# Every GPU run of docs/results.md at once, as separate processes on one GPU (the models are small
# and launch-bound: one process leaves the GPU idle most of the time). Each run is torch.compile'd
# (CUDA graphs), bf16 convs with fp32 routing, data on the device, and stops at the epoch that passes
# its time limit (the card and the result rows say how many epochs ran of those planned).
#
#   training/gpu/run_all.sh launch OUT LIMIT   # start every run in the background (setsid), logs in OUT/logs
#   training/gpu/run_all.sh status OUT         # one progress line per run
#   training/gpu/run_all.sh merge OUT          # after the runs: the ablation's table and curve
#   training/gpu/run_all.sh pack OUT DEST      # compact (fp16) checkpoints, results, logs -> DEST
#
# Data: data/mnist and data/fashion-mnist (python -m training.data fetch). Times are seconds of
# fit() per training run (compilation included); LIMIT is the flagship's.
set -u
cmd=$1 R=$2
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=1
FAST=${FAST:---device cuda --compile}  # a CPU smoke run: FAST="--device cpu" EXTRA="--train-limit 256 --val-size 500" PAIRS=1
EXTRA=${EXTRA:-}

launch() {  # name command...: a detached process that outlives the shell that started it
  local name=$1; shift
  setsid nohup "$@" >"$R/logs/$name.log" 2>&1 </dev/null &
  echo "$name $!" >>"$R/pids"
}

case $cmd in
launch)
  L=$3
  mkdir -p "$R/logs" "$R/results"
  for seed in 0 1 2; do   # the flagship, three seeds (paper recipe; selection on 5,000 validation images)
    launch mnist-seed$seed python3 -m training.train $FAST --epochs 100 --eval-every 2 --seed $seed \
      --time-limit "$L" --out "$R/mnist/seed$seed" $EXTRA
  done
  launch fashion python3 -m training.experiments.fashion $FAST --epochs 100 --lr-decay 0.99 --eval-every 2 \
    --time-limit "$L" --out "$R/fashion" --model-dir "$R/models/fashion-mnist" --results-dir "$R/results" $EXTRA
  launch multimnist python3 -m training.experiments.multimnist $FAST --epochs 40 --eval-every 2 \
    --time-limit "$L" --test-pairs "${PAIRS:-100}" --out "$R/multimnist" --model-dir "$R/models/multimnist" \
    --results-dir "$R/results" --figure "$R/results/multimnist_fig5.png" $EXTRA
  launch affine python3 -m training.experiments.affine $FAST --epochs 30 --lr-decay 0.96 \
    --time-limit "$((L * 6 / 10))" --out "$R/affine" --results-dir "$R/results" --figure "$R/results/affine_test_sets.png" $EXTRA
  for v in r1-no-recon r1-recon r3-no-recon r3-recon; do   # Table 1: three trials each, one process per variant
    launch ablation-$v python3 -m training.experiments.ablation $FAST --variants $v --epochs 30 --lr-decay 0.96 \
      --eval-every 2 --time-limit "$((L / 3))" --out "$R/ablation" --results-dir "$R/results/ablation-$v" \
      --figure "$R/results/ablation-$v.png" $EXTRA
  done
  for d in mnist fashion-mnist; do   # the routings, the same budget each
    launch routing-$d python3 -m benchmarks.routing_compare $FAST --datasets $d --train-limit 0 --val-size 5000 \
      --epochs 15 --lr-decay 0.9 --eval-every 3 --time-limit "$((L / 4))" --results "$R/results/routing-$d.json" $EXTRA
  done
  ;;
status)
  while read -r name pid; do
    alive=$(kill -0 "$pid" 2>/dev/null && echo running || echo ended)
    last=$(grep -E '"epoch"|test|error|Error|Traceback' "$R/logs/$name.log" | tail -1 | cut -c1-220)
    echo "$name [$alive] $last"
  done <"$R/pids"
  ;;
merge)
  python3 -m training.experiments.ablation ${FAST%--compile} --epochs 30 --lr-decay 0.96 --out "$R/ablation" \
    --results-dir "$R/results" --figure "$R/results/routing_convergence.png" $EXTRA
  ;;
pack)
  D=$3
  mkdir -p "$D"
  for ckpt in "$R"/mnist/seed*/best.pt "$R"/fashion/best.pt "$R"/multimnist/best.pt "$R"/affine/capsnet/best.pt; do
    [ -f "$ckpt" ] || continue
    name=$(echo "${ckpt#"$R"/}" | sed 's|/best.pt||; s|/|-|g')
    python3 -m tools.compact "$ckpt" "$D/$name.pt"
  done
  find "$R" \( -name metrics.json -o -name test.json -o -name '*.png' \) -not -path "$D/*" | tar -czf "$D/small.tgz" \
    -C / --files-from - "$R/results" "$R/logs"
  ;;
esac
