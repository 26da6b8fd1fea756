#!/usr/bin/env bash
# ZeRO stages 1 and 2 against plain data parallelism on 2 GPUs through `colossal train`: GPT-2 (bf16
# with fp32 masters, AdamW, clip 1.0, B4 T1024 per GPU, dropout 0, random tokens), 30 steps each of
# zero.stage = 0 (DDP), 1 and 2. Per run: ms/step (the metrics' wall_s slope over logged steps
# 10-30), tokens/s per GPU and MFU per GPU (6N + 12 L C T FLOPs per token, N without wpe, against
# 989.4 TFLOP/s), then GPU 0's memory from LogMemoryHook's epoch line: the model states the run
# counts (parameters, gradients, masters, optimizer) and the caching allocator's peak, beside the
# ZeRO paper's model-state formulas for mixed-precision Adam (K = 12) at Nd = 2:
#   stage 0: (2 + 2 + K) Psi;   stage 1: 2 Psi + 2 Psi + K Psi / Nd;   stage 2: 2 Psi + (2 + K) Psi / Nd.
# Without accumulation the shard's gradients wait in bf16 (2 Psi / Nd, as the paper counts; Note [Shard
# gradient dtype] in parallel/zero/state_pieces.cpp), with it in f32 (4 Psi / Nd); beside them a bucket
# (stages 1, 2) or chunk (stage 3) in flight. Stage 1's whole bf16 gradients are dropped as their
# buckets are packed, so they and the shard never hold more than the larger of the two.
#
#   tools/gpu-check --run bench/compare/zero_memory.sh [gpt2] [gpt2-medium] [gpt2-large] [gpt2-xl]
# (default: gpt2-medium gpt2-xl; "none": no 2-GPU runs). COLOSSAL=path/to/colossal, OUT=folder for logs and metrics.
# STAGES="0 1 2" picks the ZeRO-1/2 stages run (empty: none); ZERO3_CPU=0 skips the cpu placement run;
# BATCH=8 runs 8 sequences per GPU instead of 4 (every run, FSDP2's too); NPROC=4 runs the sizes' runs
# (ours and FSDP2's) on 4 GPUs instead of 2 (Nd = 4 in the formulas).
#
# Then the optimizer offload on ONE GPU (zero.offload_optimizer, Note [Optimizer offload] in
# parallel/zero/host_offload.cpp), GPT-2 medium at dp = 1: ZeRO-2 without offload, with it and clipping
# (the host steps after backward), and with it and no clipping (buckets stepped on the host during
# backward): ms/step, tokens/s, MFU and the device's model states beside the host's (host=, pinned=).
# OFFLOAD=0 skips these runs; OFFLOAD_SIZE picks another size.
#
# Then ZeRO-3 with the optimizer offloaded on ONE GPU (Note [ZeRO-3 offload] in parallel/zero/
# zero3.cpp), GPT-2 medium at dp = 1 with placement "cpu": the parameter shards, masters and moments
# all on the host, written by the host step in place; with clipping and without (chunks stepped during
# backward): ms/step, tokens/s, MFU, the device's model states (parameters on the device: none) beside
# the host's (host= counts the host shards too). ZERO3_OFFLOAD=0 skips them; OFFLOAD_SIZE as above.
set -uo pipefail
cd "$(dirname "$0")/../.."
sizes=("$@")
[[ ${#sizes[@]} == 0 ]] && sizes=(gpt2-medium gpt2-xl)
[[ ${sizes[0]} == none ]] && sizes=()  # only the one-GPU offload runs
colossal=${COLOSSAL:-build-gpu/src/colossal/cli/colossal}
out=${OUT:-/tmp/zero-memory}
batch=${BATCH:-4}  # sequences of 1024 tokens per GPU (FSDP2 gets the same)
nproc=${NPROC:-2}  # GPUs of the sizes' runs
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast off (shared machines)
python3 -c "import numpy as np; np.random.default_rng(7).integers(0, 50257, size=4_000_000, dtype=np.uint16).tofile('$out/tokens.bin')"

report() {  # name, metrics file, log file, layers, width, stage, [data-parallel GPUs]
  python3 - "$@" <<'PY'
import json, os, re, sys
name, path, log, L, C, stage = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
nd = int(sys.argv[7]) if len(sys.argv) > 7 else 2
pts = [(j["step"], j["wall_s"]) for j in map(json.loads, open(path)) if j.get("event") == "step" and "wall_s" in j]
first, last = int(os.environ.get("WINDOW_FIRST", 10)), int(os.environ.get("WINDOW_LAST", 30))
pts = [p for p in pts if first <= p[0] <= last]
V, T, B = 50304, 1024, int(sys.argv[8]) if len(sys.argv) > 8 else 4
n = L * (12 * C * C + 13 * C) + V * C + 2 * C  # without wpe
psi = n + T * C                                # every parameter, wpe included
if len(pts) >= 2:
    ms = 1e3 * (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
    flops = (6 * n + 12 * L * C * T) * B * T
    speed = f"{ms:.1f} ms/step, {B * T / ms * 1e3:.0f} tokens/s per GPU, MFU per GPU {flops / (ms * 1e-3) / 989.4e12:.1%}"
else:
    speed = "too few steps"
mib = lambda key, text: float(m.group(1)) if (m := re.search(key + r"=([0-9.]+)MiB", text)) else float("nan")
lines = [l for l in open(log) if "| memory |" in l and "Epoch" in l]
mem = lines[-1] if lines else ""
K = 12
paper = {0: (4 + K) * psi, 1: 4 * psi + K * psi / nd, 2: 2 * psi + (2 + K) * psi / nd, 3: (4 + K) * psi / nd}[stage]
gib = lambda b: b / 2**30
print(f"{name}: Psi = {psi / 1e6:.0f}M; {speed}")
print(f"  model states {gib(mib('model_states', mem) * 2**20):.2f} GiB (parameters {mib('parameters', mem) / 1024:.2f}, "
      f"gradients {mib('gradients', mem) / 1024:.2f}, masters {mib('masters', mem) / 1024:.2f}, optimizer "
      f"{mib('optimizer', mem) / 1024:.2f}) against the paper's {gib(paper):.2f} GiB "
      f"({mib('model_states', mem) * 2**20 / paper - 1:+.1%}); allocator peak {mib('peak', mem) / 1024:.2f} GiB")
PY
}

run() {  # name, layers, width, heads, stage, [GPUs, extra --set arguments...]
  local name=$1 L=$2 C=$3 H=$4 stage=$5 gpus=${6:-2}
  shift 6 2>/dev/null || shift $#
  local args=(train --config configs/gpt2_tokens.toml --set "data.path=\"$out/tokens.bin\"" --set 'data.test_path=""'
    --set gradient_accumulation=1 --set bf16=true --set data.batch_size=$batch --set lr_scheduler.warmup_steps=5
    --set "model.options={ vocab_multiple = 64, dropout = 0.0, n_layer = $L, n_embd = $C, n_head = $H }"
    --set parallel.data="$gpus" --set zero.stage="$stage"
    --set train.max_steps=30 --set train.log_interval=5 --set train.progress=false --set 'train.checkpoint_dir=""'
    --metrics "$out/$name.jsonl")
  for extra in "$@"; do args+=(--set "$extra"); done
  if ! "$colossal" run --nproc_per_node "$gpus" -- "$colossal" "${args[@]}" > "$out/$name.log" 2>&1; then
    echo "$name: FAILED"; tail -8 "$out/$name.log"; return
  fi
  report "$name" "$out/$name.jsonl" "$out/$name.log" "$L" "$C" "$stage" "$gpus" "$batch"
  grep "| memory |" "$out/$name.log" | grep Epoch | tail -1 | grep -o "host=.*" | sed 's/^/  offload: /'
}

for size in "${sizes[@]}"; do
  case $size in
    gpt2) shape=(12 768 12) ;;
    gpt2-medium) shape=(24 1024 16) ;;
    gpt2-large) shape=(36 1280 20) ;;
    gpt2-xl) shape=(48 1600 25) ;;
    *) echo "unknown size '$size' (gpt2, gpt2-medium, gpt2-large, gpt2-xl)"; exit 2 ;;
  esac
  for stage in ${STAGES-0 1 2}; do run "${size}_dp${nproc}_zero$stage" "${shape[@]}" "$stage" "$nproc"; done
  # ZeRO-3 (parallel/zero/zero3.h), paper (2 + 2 + K) Psi / Nd; ours counts the shard gradients
  # (bf16 here: no accumulation) and the largest chunk's reduction in flight. Then its "cpu" placement, and PyTorch
  # FSDP2 on the same shapes (bench/compare/fsdp2_step.py, one fully_shard per block and the root).
  run "${size}_dp${nproc}_zero3" "${shape[@]}" 3 "$nproc"
  [[ ${ZERO3_CPU:-1} == 1 ]] && run "${size}_dp${nproc}_zero3_cpu" "${shape[@]}" 3 "$nproc" 'zero.placement_policy="cpu"'
  torchrun --nproc_per_node "$nproc" bench/compare/fsdp2_step.py --layers "${shape[0]}" --width "${shape[1]}" \
    --heads "${shape[2]}" --batch "$batch" 2>&1 | grep FSDP2 || echo "${size} FSDP2: FAILED"
done

case ${OFFLOAD_SIZE:-gpt2-medium} in
  gpt2) offload_shape=(12 768 12) ;; gpt2-medium) offload_shape=(24 1024 16) ;; gpt2-large) offload_shape=(36 1280 20) ;;
  gpt2-xl) offload_shape=(48 1600 25) ;; *) echo "unknown OFFLOAD_SIZE"; exit 2 ;;
esac
size=${OFFLOAD_SIZE:-gpt2-medium}
if [[ ${OFFLOAD:-1} == 1 ]]; then
  # With offload the masters and moments are on the host: the paper's formula's K Psi is not on the GPU.
  run "${size}_1gpu_zero2" "${offload_shape[@]}" 2 1
  run "${size}_1gpu_zero2_offload_clip" "${offload_shape[@]}" 2 1 zero.offload_optimizer=true
  run "${size}_1gpu_zero2_offload_noclip" "${offload_shape[@]}" 2 1 zero.offload_optimizer=true clip_grad_norm=0
fi

if [[ ${ZERO3_OFFLOAD:-1} == 1 ]]; then
  # The paper's line is (4 + K) Psi at Nd = 1; with offload only the gradients' f32 shard and a chunk
  # in flight are on the GPU, the rest is host=.
  run "${size}_1gpu_zero3_offload_cpu_clip" "${offload_shape[@]}" 3 1 zero.offload_optimizer=true \
    'zero.placement_policy="cpu"'
  run "${size}_1gpu_zero3_offload_cpu_noclip" "${offload_shape[@]}" 3 1 zero.offload_optimizer=true \
    'zero.placement_policy="cpu"' clip_grad_norm=0
fi

if [[ -n ${LARGE:-} ]]; then
  # The largest-model run of issue 21 on ONE GPU: a GPT of LARGE="n_layer n_embd n_head" under ZeRO-3
  # with the optimizer offloaded, each placement of LARGE_PLACEMENTS (default "cpu auto"), activation
  # checkpointing, no clipping (chunks stepped on the host during the last backward), LARGE_BATCH
  # sequences (default 8) per micro-step and LARGE_ACCUM micro-steps (default 8) per update, for
  # LARGE_UPDATES updates (default 4). ms/step and MFU are per micro-step over the updates after the
  # first (the host's step included); MFU counts 6N + 12LCT per token, not the recomputation.
  read -r large_l large_c large_h <<< "$LARGE"
  accum=${LARGE_ACCUM:-8}
  updates=${LARGE_UPDATES:-4}
  batch=${LARGE_BATCH:-8}
  for placement in ${LARGE_PLACEMENTS:-cpu auto}; do
    WINDOW_FIRST=$accum WINDOW_LAST=$((accum * updates)) run "gpt_L${large_l}_C${large_c}_1gpu_zero3_offload_$placement" \
      "$large_l" "$large_c" "$large_h" 3 1 zero.offload_optimizer=true "zero.placement_policy=\"$placement\"" \
      clip_grad_norm=0 gradient_accumulation="$accum" train.max_steps="$updates" train.log_interval="$accum" \
      model.options.checkpoint_activations=true
  done
fi
