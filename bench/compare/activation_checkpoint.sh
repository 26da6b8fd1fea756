#!/usr/bin/env bash
# Activation checkpointing on one GPU through `colossal train`: GPT-2 (bf16 with fp32 masters, AdamW,
# clip 1.0, T1024, dropout 0.1, random tokens) with model.options.checkpoint_activations off and on,
# 30 steps each. Per run: ms/step (the metrics' wall_s slope over logged steps 10-30), tokens/s, MFU
# (6N + 12 L C T model FLOPs per token against 989.4 TFLOP/s; the recompute's extra forward is not
# counted, so MFU drops by what it costs) and the caching allocator's peak from LogMemoryHook's epoch
# line; then the runs' losses step by step (dropout masks are replayed in the recompute, so they
# should agree to the last bit where the kernels are deterministic): the run without checkpointing
# is made twice, and the two's difference is the yardstick for the checkpointed run's.
#
#   tools/gpu-check --run bench/compare/activation_checkpoint.sh [size] [batch] ...
# size: gpt2 (default), gpt2-medium, gpt2-large, gpt2-xl; batch: B per step (default 16); several
# "size:batch" pairs may be given, e.g. gpt2:16 gpt2:32 gpt2-medium:16. COLOSSAL=path/to/colossal,
# OUT=folder for logs and metrics. A run that does not fit reports FAILED and its last lines.
set -uo pipefail
cd "$(dirname "$0")/../.."
pairs=("$@")
[[ ${#pairs[@]} == 0 ]] && pairs=(gpt2:16)
colossal=${COLOSSAL:-build-gpu/src/colossal/cli/colossal}
out=${OUT:-/tmp/activation-checkpoint}
mkdir -p "$out"
python3 -c "import numpy as np; np.random.default_rng(7).integers(0, 50257, size=4_000_000, dtype=np.uint16).tofile('$out/tokens.bin')"

report() {  # name, metrics file, log file, layers, width, batch
  python3 - "$@" <<'PY'
import json, re, sys
name, path, log, L, C, B = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
pts = [(j["step"], j["wall_s"]) for j in map(json.loads, open(path)) if j.get("event") == "step" and "wall_s" in j]
pts = [p for p in pts if 10 <= p[0] <= 30]
V, T = 50304, 1024
n = L * (12 * C * C + 13 * C) + V * C + 2 * C  # without wpe
if len(pts) >= 2:
    ms = 1e3 * (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
    flops = (6 * n + 12 * L * C * T) * B * T
    speed = f"{ms:.1f} ms/step, {B * T / ms * 1e3:.0f} tokens/s, MFU {flops / (ms * 1e-3) / 989.4e12:.1%}"
else:
    speed = "too few steps"
lines = [l for l in open(log) if "| memory |" in l and "Epoch" in l]
m = re.search(r"peak=([0-9.]+)MiB", lines[-1]) if lines else None
peak = f"{float(m.group(1)) / 1024:.2f} GiB" if m else "?"
print(f"{name}: {speed}; allocator peak {peak}")
PY
}

compare_losses() {  # off metrics, on metrics
  python3 - "$@" <<'PY'
import json, sys
def losses(path):
    return {j["step"]: j["loss"] for j in map(json.loads, open(path)) if j.get("event") == "step"}
off, on = losses(sys.argv[1]), losses(sys.argv[2])
common = sorted(set(off) & set(on))
worst = max((abs(off[s] - on[s]) for s in common), default=float("nan"))
same = sum(off[s] == on[s] for s in common)
print(f"  losses: {same} of {len(common)} logged steps identical, largest difference {worst:.3g}")
PY
}

for pair in "${pairs[@]}"; do
  size=${pair%%:*}
  batch=16
  [[ $pair == *:* ]] && batch=${pair##*:}
  case $size in
    gpt2) shape=(12 768 12) ;;
    gpt2-medium) shape=(24 1024 16) ;;
    gpt2-large) shape=(36 1280 20) ;;
    gpt2-xl) shape=(48 1600 25) ;;
    *) echo "unknown size '$size' (gpt2, gpt2-medium, gpt2-large, gpt2-xl)"; exit 2 ;;
  esac
  L=${shape[0]} C=${shape[1]} H=${shape[2]}
  # "false" twice: how far two runs without checkpointing already differ (nondeterministic GPU
  # kernels, e.g. atomics in a backward) is the yardstick for the checkpointed run's difference.
  for run in false false_again true; do
    on=${run%_again}
    name="${size}_B${batch}_checkpoint_${run}"
    args=(train --config configs/gpt2_tokens.toml --set "data.path=\"$out/tokens.bin\"" --set 'data.test_path=""'
      --set gradient_accumulation=1 --set bf16=true --set "data.batch_size=$batch" --set lr_scheduler.warmup_steps=5
      --set "model.options={ vocab_multiple = 64, dropout = 0.1, n_layer = $L, n_embd = $C, n_head = $H, checkpoint_activations = $on }"
      --set train.max_steps=30 --set train.log_interval=5 --set train.progress=false --set 'train.checkpoint_dir=""'
      --metrics "$out/$name.jsonl")
    if ! "$colossal" "${args[@]}" > "$out/$name.log" 2>&1; then
      echo "$name: FAILED"; tail -8 "$out/$name.log"; continue
    fi
    report "$name" "$out/$name.jsonl" "$out/$name.log" "$L" "$C" "$batch"
  done
  off="$out/${size}_B${batch}_checkpoint_false.jsonl" on="$out/${size}_B${batch}_checkpoint_true.jsonl"
  again="$out/${size}_B${batch}_checkpoint_false_again.jsonl"
  [[ -s $off && -s $again ]] && echo "  off against off again:" && compare_losses "$off" "$again"
  [[ -s $off && -s $on ]] && echo "  off against on:" && compare_losses "$off" "$on"
done
