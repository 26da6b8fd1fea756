#!/usr/bin/env bash
# Every tutorial config of configs/ (seeds 000-003) at full size through `colossal train` on GPUs, on
# stand-in CIFAR-10 files (random bytes in the binary format, bench/compare/stand_in_cifar10.py): each
# for about $STEPS iterations (default 200; an iteration is one batch, a micro-step of the config's
# gradient accumulation A; train.max_steps counts updates, so STEPS / A of them) with the config's
# own hyperparameters, the layout it asks for, and evaluation off;
# ms/iteration is the metrics' wall_s slope over the logged iterations from the first quarter to the
# last, images/s an iteration's images (over every rank) over it, and the last logged loss shows it
# trained. Configs needing more GPUs than the
# machine has are listed as skipped. Issue 20's "every tutorial config runs on 2 GPUs at full size".
#
#   tools/gpu-check --run bench/compare/tutorial_configs.sh [NAME ...]   # default: every config below
#   GPUS=2 STEPS=24 EXTRA_SET='train.device="cpu"' COLOSSAL=build/src/colossal/cli/colossal \
#     bench/compare/tutorial_configs.sh resnet50_pp2                     # the script itself, on CPU ranks
set -uo pipefail
cd "$(dirname "$0")/../.."
colossal=${COLOSSAL:-build-gpu/src/colossal/cli/colossal}
out=${OUT:-/tmp/tutorial-configs}
steps=${STEPS:-200}
gpus=${GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')}
export NCCL_NVLS_ENABLE=0
data=${CIFAR_DIR:-/tmp/stand-in-cifar10}  # 180 MB: kept out of $OUT
python3 bench/compare/stand_in_cifar10.py "$data"
mkdir -p "$out/logs"

# name | config | ranks | images per step | extra --set arguments
rows=(
  "vit_b16_dp2|configs/vit_b16_cifar10.toml|2|512|parallel.data=2"
  "vit_b16_pp2|configs/vit_b16_pipeline_cifar10.toml|2|256|"
  "vit_b16_pp2_tp2|configs/vit_b16_hybrid_cifar10.toml|4|256|"
  "vit_hybrid_pp2_tp2|configs/vit_cifar10_hybrid.toml|4|256|"
  "resnet50_dp2|configs/resnet50_cifar10.toml|2|128|parallel.data=2"
  "resnet50_pp2|configs/resnet50_pipeline_cifar10.toml|2|64|"
  "resnet50_pp2_v2|configs/resnet50_interleaved_cifar10.toml|2|64|"
  "vit_l16_pp2|configs/vit_l16_pipeline_cifar10.toml|2|16|"
)
wanted=("$@")
printf '%-20s %-42s %5s %6s %10s %10s %10s\n' run config ranks accum ms/iter images/s "last loss"
for row in "${rows[@]}"; do
  IFS='|' read -r name config ranks images extra <<< "$row"
  if [[ ${#wanted[@]} -gt 0 && ! " ${wanted[*]} " =~ " $name " ]]; then continue; fi
  if (( ranks > gpus )); then
    printf '%-20s %-42s %5s %s\n' "$name" "$config" "$ranks" "skipped: needs $ranks GPUs, this machine has $gpus"
    continue
  fi
  accum=$(sed -n 's/^gradient_accumulation *= *\([0-9]*\).*/\1/p' "$config")
  accum=${accum:-1}
  updates=$(( (steps + accum - 1) / accum ))
  iterations=$(( updates * accum ))
  log_interval=10
  (( iterations < 100 )) && log_interval=1
  args=(--config "$config" --set "data.path=\"$data\"" --set train.max_steps="$updates" --set train.log_interval=$log_interval
    --set train.test_interval=0 --set train.progress=false --metrics "$out/logs/$name.jsonl")
  [[ -n $extra ]] && args+=(--set "$extra")
  [[ -n ${EXTRA_SET:-} ]] && args+=(--set "$EXTRA_SET")  # e.g. train.device="cpu" to try the script on CPU ranks
  rm -f "$out/logs/$name.jsonl"
  # The logs stay in $out/logs (not $OUT's top level: a device call brings back only a few files).
  if "$colossal" run --nproc_per_node "$ranks" -- "$colossal" train "${args[@]}" > "$out/logs/$name.log" 2>&1; then
    python3 - "$out/logs/$name.jsonl" "$name" "$config" "$ranks" "$images" "$iterations" "$accum" <<'PY'
import json, sys
path, name, config, ranks, images, steps, accum = sys.argv[1:]
lines = [json.loads(l) for l in open(path)]
pts = [(j["step"], j["wall_s"], j.get("loss")) for j in lines if j.get("event") == "step" and "wall_s" in j]
window = [p for p in pts if int(steps) // 4 <= p[0] <= int(steps) - 1]
ms = 1e3 * (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0]) if len(window) > 1 else float("nan")
loss = pts[-1][2] if pts else float("nan")
print(f"{name:<20} {config:<42} {ranks:>5} {accum:>6} {ms:>10.2f} {int(images) * 1e3 / ms:>10.0f} {loss:>10.4f}")
PY
  else
    printf '%-20s %-42s %5s %s\n' "$name" "$config" "$ranks" "FAILED (log: $out/logs/$name.log)"
    tail -5 "$out/logs/$name.log"
  fi
done
