#!/usr/bin/env bash
# GPT at tensor parallelism 2 through `colossal train` (configs/gpt2_tp.toml's built-in 1D policy,
# bf16 with fp32 masters, AdamW, clip 1.0, B8 T1024, dropout 0, random tokens) on 2 GPUs, and the same
# model on one GPU: ms/step (the metrics' wall_s slope over logged steps 10-40) and MFU per GPU,
# counting each GPU's share of (6N + 12 L C T) FLOPs per token (N without wpe), against 989.4 TFLOP/s.
#
#   tools/gpu-check --run bench/compare/tp_mfu.sh [1.3b] [350m] [serial] [serial350m] [1.3b-sp] [1.3b-tp4]
#        [1.3b-chunks] [1.3b-tp4-chunks]   (parallel.tensor.overlap_chunks = 2)
#        [1.3b-rowsN] [350m-rowsN]         (parallel.tensor.row_blocks = N)
#        [1.3b-prof]                        (a profile of steps 20-22: $OUT/tp2_prof*.json and their summaries)
#        [1.3b-ufwd] [serial-ufwd]          (COLOSSAL_UPDATE_UNDER_FORWARD=1: the update under the next forward,
#                                           Note [Update under the next forward] in engine/engine.cpp)
#        [1.3b-ch32]                        (NCCL_MIN_NCHANNELS=32 NCCL_MIN_CTAS=32: NCCL's collectives on 32
#                                           channels; docs/benchmarks.md, session 20)
#        [1.3b-fused] [1.3b-ce-fused] [350m-ce-fused]
#                                           (COLOSSAL_TP_FUSED_RESIDUAL=1: the blocks' residual and c_proj bias
#                                           in the row layers' GEMMs, Note [A row-parallel layer's residual in its GEMM])
#        [1.3b-ce] [1.3b-ce-rowsN] [1.3b-ce-chunks[N]] [1.3b-ce-chunks-prof] [350m-ce] [350m-ce-chunks]
#                                           (COLOSSAL_TP_COPY_ENGINE=1: the tensor group's sums moved by the
#                                           copy engines, Note [Pair all-reduce by the copy engines])
#        [torch-1.3b-tpN]                   (PyTorch's DTensor plans on N GPUs, bench/compare/torch_tp.py)
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
V, T, B = 50304, 1024, 8
n = L * (12 * C * C + 13 * C) + V * C + 2 * C  # without wpe
flops = (6 * n + 12 * L * C * T) * B * T
print(f"{name}: {ms:.2f} ms/step, {B * T / ms * 1e3:.0f} tokens/s, MFU per GPU {flops / gpus / (ms * 1e-3) / 989.4e12:.1%}")
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
  case $part in
    1.3b) run gpt1.3b_tp2 2 24 2048 16 ;;
    350m) run gpt350m_tp2 2 24 1024 16 ;;
    serial) run gpt1.3b_1gpu 1 24 2048 16 ;;
    1.3b-prof) run gpt1.3b_tp2_prof 2 24 2048 16 --profile "$out/tp2_prof.json" --profile-steps 20:3 ;;
    1.3b-ufwd) (export COLOSSAL_UPDATE_UNDER_FORWARD=1; run gpt1.3b_tp2_ufwd 2 24 2048 16) ;;
    1.3b-ch32) (export NCCL_MIN_NCHANNELS=32 NCCL_MIN_CTAS=32; run gpt1.3b_tp2_ch32 2 24 2048 16) ;;
    1.3b-ufwd-prof) (export COLOSSAL_UPDATE_UNDER_FORWARD=1
                     run gpt1.3b_tp2_ufwd_prof 2 24 2048 16 --profile "$out/tp2_ufwd_prof.json" --profile-steps 20:3) ;;
    1.3b-ce) (export COLOSSAL_TP_COPY_ENGINE=1; run gpt1.3b_tp2_ce 2 24 2048 16) ;;
    1.3b-ce-rows*) (export COLOSSAL_TP_COPY_ENGINE=1
                    run "gpt1.3b_tp2_ce_rows${part#1.3b-ce-rows}" 2 24 2048 16 --set parallel.tensor.row_blocks="${part#1.3b-ce-rows}") ;;
    1.3b-ce-prof) (export COLOSSAL_TP_COPY_ENGINE=1
                   run gpt1.3b_tp2_ce_prof 2 24 2048 16 --profile "$out/tp2_ce_prof.json" --profile-steps 20:3) ;;
    1.3b-ce-chunks-prof) (export COLOSSAL_TP_COPY_ENGINE=1
                   run gpt1.3b_tp2_ce_chunks_prof 2 24 2048 16 --set parallel.tensor.overlap_chunks=2 --profile "$out/tp2_ce_chunks_prof.json" --profile-steps 20:3
                   python3 bench/compare/stream_gaps.py "$out"/tp2_ce_chunks_prof*.json | head -60) ;;
    1.3b-ce-chunks*) (export COLOSSAL_TP_COPY_ENGINE=1; n=${part#1.3b-ce-chunks}; n=${n:-2}
                      run "gpt1.3b_tp2_ce_chunks$n" 2 24 2048 16 --set parallel.tensor.overlap_chunks="$n") ;;
    350m-ce) (export COLOSSAL_TP_COPY_ENGINE=1; run gpt350m_tp2_ce 2 24 1024 16) ;;
    1.3b-fused) (export COLOSSAL_TP_FUSED_RESIDUAL=1; run gpt1.3b_tp2_fused 2 24 2048 16) ;;
    1.3b-ce-fused) (export COLOSSAL_TP_COPY_ENGINE=1 COLOSSAL_TP_FUSED_RESIDUAL=1; run gpt1.3b_tp2_ce_fused 2 24 2048 16) ;;
    350m-ce-fused) (export COLOSSAL_TP_COPY_ENGINE=1 COLOSSAL_TP_FUSED_RESIDUAL=1; run gpt350m_tp2_ce_fused 2 24 1024 16) ;;
    350m-ce-chunks) (export COLOSSAL_TP_COPY_ENGINE=1
                     run gpt350m_tp2_ce_chunks2 2 24 1024 16 --set parallel.tensor.overlap_chunks=2) ;;
    serial-ufwd) (export COLOSSAL_UPDATE_UNDER_FORWARD=1; run gpt1.3b_1gpu_ufwd 1 24 2048 16) ;;
    serial350m) run gpt350m_1gpu 1 24 1024 16 ;;
    1.3b-sp) run gpt1.3b_tp2_sp 2 24 2048 16 --set parallel.tensor.sequence_parallel=true ;;
    1.3b-tp4) run gpt1.3b_tp4 4 24 2048 16 ;;
    1.3b-chunks) run gpt1.3b_tp2_chunks2 2 24 2048 16 --set parallel.tensor.overlap_chunks=2 ;;
    1.3b-tp4-chunks) run gpt1.3b_tp4_chunks2 4 24 2048 16 --set parallel.tensor.overlap_chunks=2 ;;
    1.3b-rows*) run "gpt1.3b_tp2_rows${part#1.3b-rows}" 2 24 2048 16 --set parallel.tensor.row_blocks="${part#1.3b-rows}" ;;
    350m-rows*) run "gpt350m_tp2_rows${part#350m-rows}" 2 24 1024 16 --set parallel.tensor.row_blocks="${part#350m-rows}" ;;
    # PyTorch's DTensor tensor parallelism on the same shapes (bench/compare/torch_tp.py).
    torch-1.3b-tp*) torchrun --standalone --nproc_per_node "${part#torch-1.3b-tp}" bench/compare/torch_tp.py \
          --layers 24 --width 2048 --heads 16 --batch 8 2>&1 | grep -E "torch DTensor|Error" ;;
    *) echo "unknown part '$part' (1.3b, 350m, serial, serial350m, 1.3b-sp, 1.3b-tp4, 1.3b-chunks, 1.3b-tp4-chunks," \
         "1.3b-prof, 1.3b-ufwd, 1.3b-ufwd-prof, serial-ufwd, 1.3b-ch32," \
         "1.3b-rowsN, 350m-rowsN, torch-1.3b-tpN)"; exit 2 ;;
  esac
done
