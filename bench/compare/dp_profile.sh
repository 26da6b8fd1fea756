#!/usr/bin/env bash
# Where a data-parallel step's time goes: GPT-2 124M through `colossal train` (bf16 with fp32 masters,
# B16 x T1024 per GPU, dropout 0, random tokens) on one GPU and on N GPUs, each with and without the
# config's clipping, profiled over steps 120-129 (core/profiler.h: host ranges, CUDA-event ranges
# and CUPTI's kernels per stream). Prints ms/step (the metrics' wall_s slope over steps 30-110,
# before the profiled window) and each run's profile summary; traces and logs go to $OUT.
#
#   tools/gpu-check --run bench/compare/dp_profile.sh [N]      # N GPUs (default 2)
#   DP_PROFILE_GPUS="2" DP_PROFILE_CLIPS="0.0" DP_PROFILE_TAG=b100 COLOSSAL_DP_BUCKET_MB=100 ...
#     (only those runs; the tag names their files)
set -uo pipefail
cd "$(dirname "$0")/../.."
gpus=${1:-2}
colossal=${COLOSSAL:-build-gpu/src/colossal/cli/colossal}
out=${OUT:-/tmp/dp-profile}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
python3 -c "import numpy as np; np.random.default_rng(7).integers(0, 50257, size=4_000_000, dtype=np.uint16).tofile('$out/tokens.bin')"
common=(train --config configs/gpt2_tokens.toml --set "data.path=\"$out/tokens.bin\"" --set 'data.test_path=""'
  --set data.batch_size=16 --set gradient_accumulation=1 --set bf16=true
  --set 'model.options={ vocab_multiple = 64, dropout = 0.0 }' --set train.max_steps=140 --set train.log_interval=10
  --set train.progress=false --set lr_scheduler.warmup_steps=10 --profile-steps 120:10)

ms_per_step() {  # metrics file -> ms/step over logged steps 30..110
  python3 - "$1" <<'EOF'
import json, sys
pts = [(j["step"], j["wall_s"]) for j in map(json.loads, open(sys.argv[1])) if j.get("event") == "step" and "wall_s" in j]
pts = [p for p in pts if 30 <= p[0] <= 110]
print(f"{1e3 * (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]):.2f}" if len(pts) > 1 else "nan")
EOF
}

status=0
for clip in ${DP_PROFILE_CLIPS:-0.0 1.0}; do
  for n in ${DP_PROFILE_GPUS:-1 $gpus}; do
    name="gpt2_${n}gpu_clip${clip}${DP_PROFILE_TAG:+_$DP_PROFILE_TAG}"
    run=("$colossal" "${common[@]}" --set "clip_grad_norm=$clip" --profile "$out/$name.json" --metrics "$out/$name.jsonl")
    [[ $n != 1 ]] && run=("$colossal" run --nproc_per_node "$n" -- "${run[@]}")
    if ! "${run[@]}" > "$out/$name.log" 2>&1; then
      echo "== $name FAILED"; tail -30 "$out/$name.log"; status=1; continue
    fi
    echo "== $name: $(ms_per_step "$out/$name.jsonl") ms/step"
    # The profile summary (rank 0's, when several ranks print theirs).
    awk '/^profile of/{p++} p==1' "$out/$name.log" | grep -v '^step \|^Epoch\|^Training\|^train:' | head -45
  done
done
exit $status
