#!/usr/bin/env bash
# GPT at tensor parallelism 2 through `colossal train` (configs/gpt2_tp.toml's built-in 1D policy,
# bf16 with fp32 masters, AdamW, clip 1.0, B8 T1024, dropout 0, random tokens) on 2 GPUs, and the same
# model on one GPU: ms/step (the metrics' wall_s slope over logged steps 10-40, and the median of its
# 5-step intervals) and MFU per GPU,
# counting each GPU's share of (6N + 12 L C T) FLOPs per token (N without wpe), against 989.4 TFLOP/s.
#
#   tools/gpu-check --run bench/compare/tp_mfu.sh [PART...]   (default: 1.3b 350m)
#
# A part is a model, then any of the modifiers, joined by '-' (1.3b-nccl-unfused, 1.3b-rows2-ufwd):
#   models:    1.3b (GPT 1.3B at tp=2), 350m (GPT-2 350M at tp=2), serial (GPT 1.3B on one GPU),
#              serial350m (GPT-2 350M on one GPU)
#   nccl       parallel.tensor.all_reduce = "nccl" (the default "auto" sums by the copy engines on a
#              GPU pair, Note [Pair all-reduce by the copy engines])
#   ce         parallel.tensor.all_reduce = "copy_engines" (an error where they cannot)
#   unfused    parallel.tensor.fused_residual = false (the residual and c_proj bias added after the
#              all-reduce, not in the row layers' GEMMs: Note [A row-parallel layer's residual in its GEMM])
#   rowsN      parallel.tensor.row_blocks = N (the default 0 picks 2 for 32 MiB outputs, else 1)
#   chunksN    parallel.tensor.overlap_chunks = N
#   sp         parallel.tensor.sequence_parallel      tp4       4 GPUs instead of 2
#   ufwd       COLOSSAL_UPDATE_UNDER_FORWARD=1 (Note [Update under the next forward] in engine/engine.cpp)
#   ch32       NCCL_MIN_NCHANNELS=32 NCCL_MIN_CTAS=32 (docs/benchmarks.md, session 20)
#   prof       a profile of steps 20-22: $OUT/<name>_prof*.json and stream_gaps.py's summary
# and torch-1.3b-tpN: PyTorch's DTensor plans on N GPUs (bench/compare/torch_tp.py).
set -uo pipefail
cd "$(dirname "$0")/../.."
parts=("$@")
[[ ${#parts[@]} == 0 ]] && parts=(1.3b 350m)
colossal=${COLOSSAL:-build-gpu/src/colossal/cli/colossal}
out=${OUT:-/tmp/tp-mfu}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast off (shared machines)
python3 -c "import numpy as np; np.random.default_rng(7).integers(0, 50257, size=4_000_000, dtype=np.uint16).tofile('$out/tokens.bin')"

report() {  # name, metrics file, layers, width, gpus
  python3 - "$@" <<'EOF'
import json, sys
name, path, L, C, gpus = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
pts = [(j["step"], j["wall_s"]) for j in map(json.loads, open(path)) if j.get("event") == "step" and "wall_s" in j]
pts = [p for p in pts if 10 <= p[0] <= 40]
if len(pts) < 2:
    print(f"{name}: too few steps"); sys.exit()
ms = 1e3 * (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
# The logged intervals' median beside the slope: one slow step (the host, a hiccup) moves the slope.
rates = sorted(1e3 * (b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(pts, pts[1:]))
median = rates[len(rates) // 2] if len(rates) % 2 else (rates[len(rates) // 2 - 1] + rates[len(rates) // 2]) / 2
V, T, B = 50304, 1024, 8
n = L * (12 * C * C + 13 * C) + V * C + 2 * C  # without wpe
flops = (6 * n + 12 * L * C * T) * B * T
mfu = lambda t: flops / gpus / (t * 1e-3) / 989.4e12
print(f"{name}: {ms:.2f} ms/step, {B * T / ms * 1e3:.0f} tokens/s, MFU per GPU {mfu(ms):.1%}"
      f" (median interval {median:.2f} ms, {mfu(median):.1%}; intervals {rates[0]:.2f}-{rates[-1]:.2f})")
EOF
}

run() {  # name, gpus (= tensor-parallel size), layers, width, heads, [extra --set ...]
  local name=$1 gpus=$2 L=$3 C=$4 H=$5
  shift 5
  local args=(train --config configs/gpt2_tp.toml --set "data.path=\"$out/tokens.bin\"" --set 'data.test_path=""'
    --set gradient_accumulation=1 --set bf16=true --set data.batch_size=8 --set lr_scheduler.warmup_steps=5
    --set "model.options={ vocab_multiple = 64, dropout = 0.0, n_layer = $L, n_embd = $C, n_head = $H }"
    --set train.max_steps=40 --set train.log_interval=5 --set train.progress=false --set 'train.checkpoint_dir=""'
    --metrics "$out/$name.jsonl" "$@")
  if [[ $gpus == 1 ]]; then
    "$colossal" "${args[@]}" --set parallel.tensor.size=1 > "$out/$name.log" 2>&1
  else
    "$colossal" run --nproc_per_node "$gpus" -- "$colossal" "${args[@]}" --set parallel.tensor.size="$gpus" \
      > "$out/$name.log" 2>&1
  fi
  if [[ $? != 0 ]]; then
    echo "$name: FAILED"; tail -8 "$out/$name.log"; return
  fi
  report "$name" "$out/$name.jsonl" "$L" "$C" "$gpus"
}

for part in "${parts[@]}"; do
  if [[ $part == torch-1.3b-tp* ]]; then  # PyTorch's DTensor tensor parallelism on the same shapes
    torchrun --standalone --nproc_per_node "${part#torch-1.3b-tp}" bench/compare/torch_tp.py \
      --layers 24 --width 2048 --heads 16 --batch 8 2>&1 | grep -E "torch DTensor|Error"
    continue
  fi
  IFS=- read -r -a words <<< "$part"
  case ${words[0]} in
    1.3b) name=gpt1.3b_tp2 gpus=2 shape=(24 2048 16) ;;
    350m) name=gpt350m_tp2 gpus=2 shape=(24 1024 16) ;;
    serial) name=gpt1.3b_1gpu gpus=1 shape=(24 2048 16) ;;
    serial350m) name=gpt350m_1gpu gpus=1 shape=(24 1024 16) ;;
    *) echo "unknown part '$part': a model (1.3b, 350m, serial, serial350m) and modifiers, see the head of $0"; exit 2 ;;
  esac
  sets=() envs=() profile=0
  for word in "${words[@]:1}"; do
    case $word in
      nccl) sets+=(--set 'parallel.tensor.all_reduce="nccl"') ;;
      ce) sets+=(--set 'parallel.tensor.all_reduce="copy_engines"') ;;
      unfused) sets+=(--set parallel.tensor.fused_residual=false) ;;
      rows[0-9]*) sets+=(--set "parallel.tensor.row_blocks=${word#rows}") ;;
      chunks[0-9]*) sets+=(--set "parallel.tensor.overlap_chunks=${word#chunks}") ;;
      chunks) sets+=(--set parallel.tensor.overlap_chunks=2) ;;
      sp) sets+=(--set parallel.tensor.sequence_parallel=true) ;;
      tp4) gpus=4 name=${name/_tp2/_tp4} ;;
      ufwd) envs+=(COLOSSAL_UPDATE_UNDER_FORWARD=1) ;;
      ch32) envs+=(NCCL_MIN_NCHANNELS=32 NCCL_MIN_CTAS=32) ;;
      prof) profile=1 ;;
      *) echo "unknown modifier '$word' in '$part' (nccl ce unfused rowsN chunksN sp tp4 ufwd ch32 prof)"; exit 2 ;;
    esac
    name+="_$word"
  done
  (( profile )) && sets+=(--profile "$out/${name}_prof.json" --profile-steps 20:3)
  (if [[ ${#envs[@]} -gt 0 ]]; then export "${envs[@]}"; fi
   run "$name" "$gpus" "${shape[@]}" "${sets[@]}")
  if (( profile )) && compgen -G "$out/${name}_prof*.json" > /dev/null; then
    python3 bench/compare/stream_gaps.py "$out/${name}"_prof*.json | head -60
  fi
done
