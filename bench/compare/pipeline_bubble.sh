#!/usr/bin/env bash
# GPT-2 350M (24 layers, 1024 wide, 16 heads) through `colossal train` (configs/gpt2_tokens.toml's run,
# bf16 with fp32 masters, AdamW, B16 T1024 per data-parallel replica, dropout 0, random tokens) in
# pipeline and hybrid layouts, beside the same model on one GPU: ms/step and tokens/s (the metrics'
# wall_s slope over logged steps 10-40), MFU per GPU (6N + 12 L C T FLOPs per token, N without wpe,
# against 989.4 TFLOP/s), and for pipelines the bubble report (parallel.pipeline_report: each stage's
# busy and idle ms of a micro-step, the measured bubble idle / busy against (p - 1) / (v m)), averaged
# over the reported steps.
#
#   tools/gpu-check --run bench/compare/pipeline_bubble.sh [PART ...]   (default: serial v1 v2)
#
# 2 GPUs: v1, v2 (pp=2, 8 microbatches of 2, v = 1 and 2 chunks), the same cut by piece count
# (v1-uniform, v2-uniform) or by measured piece times (v1-measured, v2-measured).
# 4 GPUs (issue 23): pp4-m8-v1, pp4-m8-v2, pp4-m16-v1, pp4-m16-v2 (pp=4, 8 or 16 microbatches), and the
# hybrids dp4, dp2xtp2, dp2xpp2, pp2xtp2 (8 microbatches where pipelined; B16 per data-parallel replica).
# 8 GPUs (issue 23): dp2xpp2xtp2-1.3b, GPT 1.3B (L24 C2048 H16) in the three-way hybrid.
# PARTITION="uniform", "balanced" or "measured" cuts every pipelined part that names no cut itself.
# P2P="nccl", "copy_engines" or "auto" (the default) carries every pipelined part's exchanges so.
# torch-ppP-mM-vV: PyTorch's pipelining on P GPUs, M microbatches, V chunks per rank (torch_pp.py).
# PROFILE=1 also traces steps 30-32 of every run of ours (colossal train --profile: each rank's kernels
# per stream, $out/NAME.rankR.json, and its summary in the log); PROFILE_HOST=1 with it adds the host's
# stack samples over those steps ($out/NAME.rankR.json.host.txt, for tools/host-profile-report).
# LOG_INTERVAL (default 5) logs every that many steps; each logged step reads its loss, which waits for
# the GPU, so the step after it starts on an idle GPU. Pipelines report every 5 iterations (1, 6, ...):
# with LOG_INTERVAL=10 half the reports follow a logged step and half do not.
set -uo pipefail
cd "$(dirname "$0")/../.."
parts=("$@")
[[ ${#parts[@]} == 0 ]] && parts=(serial v1 v2)
colossal=${COLOSSAL:-build-gpu/src/colossal/cli/colossal}
out=${OUT:-/tmp/pipeline-bubble}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast off (shared machines)
python3 -c "import numpy as np; np.random.default_rng(7).integers(0, 50257, size=4_000_000, dtype=np.uint16).tofile('$out/tokens.bin')"

report() {  # name, metrics file, log, gpus, data-parallel size, layers, width
  python3 - "$@" <<'PY'
import json, os, re, sys
name, path, log, gpus, dp = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
L, C = int(sys.argv[6]), int(sys.argv[7])
pts = [(j["step"], j["wall_s"]) for j in map(json.loads, open(path)) if j.get("event") == "step" and "wall_s" in j]
pts = [p for p in pts if 10 <= p[0] <= 40]
if len(pts) < 2:
    print(f"{name}: too few steps"); sys.exit()
ms = 1e3 * (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
V, T, tokens = 50304, 1024, 16 * 1024 * dp
n = L * (12 * C * C + 13 * C) + V * C + 2 * C  # without wpe
mfu = (6 * n + 12 * L * C * T) * tokens / (ms * 1e-3) / gpus / 989.4e12
line = f"{name}: {ms:.1f} ms/step, {tokens / ms * 1e3:.0f} tokens/s, MFU per GPU {mfu:.1%}"
text = open(log).read()
bubbles = [(float(m.group(1)), float(m.group(2))) for m in
           re.finditer(r"bubble \(idle / busy\) ([0-9.]+), schedule \(p - 1\) / \(v m\) ([0-9.]+)", text)]
# Reports of iterations right after a logged step (whose loss read waited for the GPU) and the others.
log_interval = int(os.environ.get("LOG_INTERVAL", "5"))
after_log, others = [], []
for m in re.finditer(r"iteration (\d+): pipeline bubble:.*?bubble \(idle / busy\) ([0-9.]+)", text):
    (after_log if (int(m.group(1)) - 1) % log_interval == 0 else others).append(float(m.group(2)))
if bubbles:
    measured = sum(b[0] for b in bubbles) / len(bubbles)
    ordered = sorted(b[0] for b in bubbles)
    median = ordered[len(ordered) // 2] if len(ordered) % 2 else (ordered[len(ordered) // 2 - 1] + ordered[len(ordered) // 2]) / 2
    line += (f"; bubble {measured:.3f} (mean of {len(bubbles)} reports; median {median:.3f}, range {ordered[0]:.3f}-"
             f"{ordered[-1]:.3f}) against (p - 1) / (v m) = {bubbles[0][1]:.4f}")
    stages = {}
    for s, b, i in re.findall(r"stage (\d+) busy ([0-9.]+) ms idle ([0-9.]+) ms", text):
        stages[int(s)] = (b, i)  # the last report's
    if after_log and others:
        mid = lambda v: sorted(v)[len(v) // 2]
        line += (f"; after a logged step {mid(after_log):.3f} (median of {len(after_log)}), after an unlogged one "
                 f"{mid(others):.3f} (median of {len(others)})")
    line += "; last report: " + ", ".join(f"stage {s} busy {b} ms idle {i} ms" for s, (b, i) in sorted(stages.items()))
print(line)
PY
}

run() {  # name, gpus, data-parallel size, [extra --set ...]
  local name=$1 gpus=$2 dp=$3
  shift 3
  local args=(train --config configs/gpt2_tokens.toml --set "data.path=\"$out/tokens.bin\"" --set 'data.test_path=""'
    --set gradient_accumulation=1 --set bf16=true --set data.batch_size=16 --set data.seq_len=1024
    --set lr_scheduler.warmup_steps=5 --set model.preset='"gpt2-medium"'
    --set "model.options={ vocab_multiple = 64, dropout = 0.0 }"
    --set train.max_steps=40 --set train.log_interval="${LOG_INTERVAL:-5}" --set train.progress=false --set 'train.checkpoint_dir=""'
    --metrics "$out/$name.jsonl" "$@")
  # $PARTITION cuts every pipelined part that names none itself.
  if [[ -n ${PARTITION:-} && " $* " == *parallel.pipeline=* && " $* " != *parallel.partition=* ]]; then
    args+=(--set "parallel.partition=\"$PARTITION\"")
  fi
  # $P2P sets parallel.pipeline_p2p ("nccl", "copy_engines", "auto") on every pipelined part.
  [[ -n ${P2P:-} && " $* " == *parallel.pipeline=* ]] && args+=(--set "parallel.pipeline_p2p=\"$P2P\"")
  [[ -n ${PROFILE:-} ]] && args+=(--profile "$out/$name.json" --profile-steps 30:3)
  [[ -n ${PROFILE:-} && -n ${PROFILE_HOST:-} ]] && args+=(--profile-host)
  if [[ $gpus == 1 ]]; then
    "$colossal" "${args[@]}" > "$out/$name.log" 2>&1
  else
    "$colossal" run --nproc_per_node "$gpus" -- "$colossal" "${args[@]}" > "$out/$name.log" 2>&1
  fi
  if [[ $? != 0 ]]; then
    echo "$name: FAILED"; tail -8 "$out/$name.log"; return
  fi
  report "$name" "$out/$name.jsonl" "$out/$name.log" "$gpus" "$dp" "${LAYERS:-24}" "${WIDTH:-1024}"
}

pp4() {  # name, microbatches, chunks
  run "$1" 4 1 --set parallel.pipeline=4 --set parallel.num_microbatches="$2" --set parallel.num_chunks="$3" \
    --set parallel.pipeline_report=5
}

for part in "${parts[@]}"; do
  case $part in
    serial) run gpt350m_1gpu 1 1 ;;
    v1) run gpt350m_pp2_m8_v1 2 1 --set parallel.pipeline=2 --set parallel.num_microbatches=8 \
          --set parallel.pipeline_report=5 ;;
    v2) run gpt350m_pp2_m8_v2 2 1 --set parallel.pipeline=2 --set parallel.num_microbatches=8 \
          --set parallel.num_chunks=2 --set parallel.pipeline_report=5 ;;
    # The same cut by piece count (12 blocks and the embedding | 12 blocks and the head) instead of by
    # parameters: at microbatches of 2 x 1024 tokens a stage's time follows its blocks more than its FLOPs.
    v1-uniform) run gpt350m_pp2_m8_v1_uniform 2 1 --set parallel.pipeline=2 --set parallel.num_microbatches=8 \
          --set 'parallel.partition="uniform"' --set parallel.pipeline_report=5 ;;
    v2-uniform) run gpt350m_pp2_m8_v2_uniform 2 1 --set parallel.pipeline=2 --set parallel.num_microbatches=8 \
          --set parallel.num_chunks=2 --set 'parallel.partition="uniform"' --set parallel.pipeline_report=5 ;;
    v1-measured) run gpt350m_pp2_m8_v1_measured 2 1 --set parallel.pipeline=2 --set parallel.num_microbatches=8 \
          --set 'parallel.partition="measured"' --set parallel.pipeline_report=5 ;;
    v2-measured) run gpt350m_pp2_m8_v2_measured 2 1 --set parallel.pipeline=2 --set parallel.num_microbatches=8 \
          --set parallel.num_chunks=2 --set 'parallel.partition="measured"' --set parallel.pipeline_report=5 ;;
    pp4-m8-v1) pp4 gpt350m_pp4_m8_v1 8 1 ;;
    pp4-m8-v2) pp4 gpt350m_pp4_m8_v2 8 2 ;;
    pp4-m16-v1) pp4 gpt350m_pp4_m16_v1 16 1 ;;
    pp4-m16-v2) pp4 gpt350m_pp4_m16_v2 16 2 ;;
    dp4) run gpt350m_dp4 4 4 --set parallel.data=4 ;;
    dp2xtp2) run gpt350m_dp2_tp2 4 2 --set parallel.data=2 --set 'parallel.tensor={ mode = "1d", size = 2 }' ;;
    # configs/gpt2_tokens.toml shards the optimizer (zero.stage = 1), which a pipeline does not take yet.
    dp2xpp2) run gpt350m_dp2_pp2 4 2 --set parallel.data=2 --set parallel.pipeline=2 --set zero.stage=0 \
          --set parallel.num_microbatches=8 --set parallel.pipeline_report=5 ;;
    pp2xtp2) run gpt350m_pp2_tp2 4 1 --set parallel.pipeline=2 --set 'parallel.tensor={ mode = "1d", size = 2 }' \
          --set parallel.num_microbatches=8 --set parallel.pipeline_report=5 ;;
    # 8 GPUs (issue 23): GPT 1.3B (L24 C2048 H16) at dp2 x pp2 x tp2, B16 per replica in 8 microbatches.
    dp2xpp2xtp2-1.3b) LAYERS=24 WIDTH=2048 run gpt1.3b_dp2_pp2_tp2 8 2 \
          --set 'model.options={ vocab_multiple = 64, dropout = 0.0, n_layer = 24, n_embd = 2048, n_head = 16 }' \
          --set parallel.data=2 --set parallel.pipeline=2 --set 'parallel.tensor={ mode = "1d", size = 2 }' \
          --set zero.stage=0 --set parallel.num_microbatches=8 --set parallel.pipeline_report=5 ;;
    # PyTorch's pipelining on the same model and batch (bench/compare/torch_pp.py): torch-ppP-mM-vV.
    torch-pp*-m*-v*)
      read -r p m v <<< "$(sed -E 's/^torch-pp([0-9]+)-m([0-9]+)-v([0-9]+)$/\1 \2 \3/' <<< "$part")"
      torchrun --standalone --nproc_per_node "$p" bench/compare/torch_pp.py --microbatches "$m" --chunks "$v" 2>&1 |
        grep -E "torch pipelining|Error" ;;
    *) echo "unknown part '$part' (serial, v1, v2, v1-uniform, v2-uniform, v1-measured, v2-measured," \
         "pp4-m8-v1, pp4-m8-v2, pp4-m16-v1, pp4-m16-v2, dp4, dp2xtp2, dp2xpp2, pp2xtp2, dp2xpp2xtp2-1.3b," \
         "torch-ppP-mM-vV)"; exit 2 ;;
  esac
done
