#!/usr/bin/env bash
# configs/gpt2_tp.toml (the built-in 1D policy) and configs/gpt2_tp_specs.toml (the tutorial's
# per-parameter specs) through `colossal train` on 2 processes, as a user runs them, at a reduced size
# (GPT-2 of 2 layers, width 512, 8 heads, windows of 256 tokens, 2 a micro-batch: each row layer's
# output 1 MiB in f32, so that "auto" sums it by the copy engines on a GPU pair, the configs'
# accumulation 4, clipping, AdamW and warmup; dropout 0, f32 with TF32 off), on random tokens made
# alike everywhere, for $STEPS updates. Issue 19's "the two configs train on 2 GPUs and on 2 CPU ranks;
# their losses agree step by step": run it on each, then compare the two folders.
#
#   tools/gpu-check --run bench/compare/tp_configs.sh gpu        # 2 GPUs (NCCL): $OUT/gpu/*.jsonl
#   COLOSSAL=build/src/colossal/cli/colossal bench/compare/tp_configs.sh cpu   # 2 CPU ranks (MPI)
#   bench/compare/tp_configs.sh compare DIR_A DIR_B                # largest relative loss difference
set -uo pipefail
cd "$(dirname "$0")/../.."
colossal=${COLOSSAL:-build-gpu/src/colossal/cli/colossal}
out=${OUT:-/tmp/tp-configs}
steps=${STEPS:-10}
export NCCL_NVLS_ENABLE=0

if [[ ${1:-} == compare ]]; then
  python3 - "$2" "$3" <<'EOF'
import json, pathlib, sys
a, b = map(pathlib.Path, sys.argv[1:3])
def losses(path):
    return {j["step"]: j["loss"] for j in map(json.loads, open(path)) if j.get("event") == "step" and "loss" in j}
for name in ("gpt2_tp", "gpt2_tp_specs"):
    x, y = losses(a / f"{name}.jsonl"), losses(b / f"{name}.jsonl")
    steps = sorted(set(x) & set(y))
    if not steps or len(steps) != len(x) or len(steps) != len(y):
        print(f"{name}: steps differ ({len(x)} in {a}, {len(y)} in {b})"); continue
    worst = max(steps, key=lambda s: abs(x[s] - y[s]) / abs(y[s]))
    print(f"{name}: {len(steps)} steps, first loss {x[steps[0]]:.6f} / {y[steps[0]]:.6f}, last {x[steps[-1]]:.6f} / "
          f"{y[steps[-1]]:.6f}; largest relative difference {abs(x[worst] - y[worst]) / abs(y[worst]):.2e} (step {worst})")
EOF
  exit
fi

where=${1:?gpu or cpu}
dir=$out/$where
mkdir -p "$dir"
python3 -c "import array, random; r = random.Random(11)
array.array('H', (r.randrange(50257) for _ in range(200_000))).tofile(open('$dir/tokens.bin', 'wb'))"  # no numpy needed
device=()
[[ $where == cpu ]] && device=(--set 'train.device="cpu"')
for name in gpt2_tp gpt2_tp_specs; do
  "$colossal" run --nproc_per_node 2 -- "$colossal" train --config "configs/$name.toml" \
    --set "data.path=\"$dir/tokens.bin\"" --set 'data.test_path=""' --set data.seq_len=256 --set data.batch_size=2 \
    --set model.options.n_layer=2 --set model.options.n_embd=512 --set model.options.n_head=8 \
    --set model.options.dropout=0.0 --set train.tf32=false --set lr_scheduler.warmup_steps=3 \
    --set train.max_steps="$steps" --set train.log_interval=1 --set train.progress=false \
    --set 'train.checkpoint_dir=""' "${device[@]}" --metrics "$dir/$name.jsonl" > "$dir/$name.log" 2>&1
  rc=$?
  echo "$name on $where: exit $rc, $(grep -c '"event": *"step"' "$dir/$name.jsonl" 2>/dev/null || echo 0) steps logged"
  [[ $rc != 0 ]] && tail -5 "$dir/$name.log"
done
rm -f "$dir/tokens.bin"
