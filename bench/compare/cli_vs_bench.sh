#!/usr/bin/env bash
# `colossal train` beside train_step_bench (the same model, batch and precision: bf16 with fp32
# masters, AdamW) and beside PyTorch's step, on one GPU in one call: issue 18's table in
# docs/benchmarks.md. ms/step of a `colossal train` run is the metrics' wall_s slope over logged
# steps 40-110 of 120 (random tokens or synthetic images; the configs' clipping on, 1.0).
#
#   tools/gpu-check --run bench/compare/cli_vs_bench.sh [gpt2] [images] [gpt1.3b] [torch]
#
# gpt2: GPT-2 124M B16 T1024, dropout 0 and 0.1, through the bench and the CLI (clip 1.0 and 0).
# images: ViT-B/16 (B128) and ResNet-50 (B128) at 224 px, the bench beside the CLI on synthetic images.
# gpt1.3b: GPT L24 C2048 H16 B8 T1024 through the CLI with and without clipping.
# torch: bench/compare/train_step.py GPT-2 compile and eager (TORCH_MODES), dropout 0 and 0.1.
set -uo pipefail
cd "$(dirname "$0")/../.."
parts=("$@")
[[ ${#parts[@]} == 0 ]] && parts=(gpt2 images gpt1.3b torch)
colossal=${COLOSSAL:-build-gpu/src/colossal/cli/colossal}
bench=${BENCH:-build-gpu/bench/train_step/train_step_bench}
out=${OUT:-/tmp/cli-vs-bench}
mkdir -p "$out"
python3 -c "import numpy as np; np.random.default_rng(7).integers(0, 50257, size=4_000_000, dtype=np.uint16).tofile('$out/tokens.bin')"

ms_per_step() {  # metrics file -> ms/step over logged steps 40..110
  python3 - "$1" <<'EOF'
import json, sys
pts = [(j["step"], j["wall_s"]) for j in map(json.loads, open(sys.argv[1])) if j.get("event") == "step" and "wall_s" in j]
pts = [p for p in pts if 40 <= p[0] <= 110]
print(f"{1e3 * (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]):.2f}" if len(pts) > 1 else "nan")
EOF
}

cli() {  # name, then colossal train arguments
  local name=$1
  shift
  if "$colossal" train "$@" --set train.max_steps=120 --set train.log_interval=10 --set train.progress=false \
    --metrics "$out/$name.jsonl" > "$out/$name.log" 2>&1; then
    echo "cli   $name: $(ms_per_step "$out/$name.jsonl") ms/step"
  else
    echo "cli   $name: FAILED"
    tail -5 "$out/$name.log"
  fi
  rm -f "$out/$name.jsonl"
}

bench_row() {  # name, then train_step_bench arguments
  local name=$1
  shift
  echo "bench $name: $("$bench" --steps 50 --warmup 20 "$@" 2>&1 | awk '/ms\/step/{getline; print}')"
}

gpt2_common=(--config configs/gpt2_tokens.toml --set "data.path=\"$out/tokens.bin\"" --set 'data.test_path=""'
  --set data.batch_size=16 --set gradient_accumulation=1 --set bf16=true --set lr_scheduler.warmup_steps=10)
for part in "${parts[@]}"; do
  case $part in
    gpt2)
      for p in 0.0 0.1; do
        bench_row "gpt2_dropout$p" --model gpt2 --dropout "$p"
        for clip in 1.0 0.0; do
          cli "gpt2_dropout${p}_clip$clip" "${gpt2_common[@]}" --set "clip_grad_norm=$clip" \
            --set "model.options={ vocab_multiple = 64, dropout = $p }"
        done
      done
      ;;
    images)
      image_common=(--set bf16=true --set gradient_accumulation=1 --set clip_grad_norm=1.0
        --set 'data.dataset="synthetic"' --set 'data.path=""' --set 'data.transforms=[]' --set data.num_workers=8
        --set 'data.options={ size = 25600, test_size = 0, image_size = 224, channels = 3, num_classes = 1000 }'
        --set 'optimizer.name="adamw"' --set optimizer.lr=1e-4 --set optimizer.weight_decay=0.1
        --set 'lr_scheduler.name="cosine"' --set lr_scheduler.warmup_steps=10 --set lr_scheduler.warmup_epochs=0
        --set train.epochs=0 --set data.batch_size=128)
      bench_row vit_b16 --model vit_base_patch16_224
      cli vit_b16 --config configs/vit_b16_cifar10.toml "${image_common[@]}" --set 'model.options={ dropout = 0.0 }'
      bench_row resnet50 --model resnet50
      cli resnet50 --config configs/resnet50_cifar10.toml "${image_common[@]}"
      ;;
    gpt1.3b)
      for clip in 1.0 0.0; do
        cli "gpt1.3b_clip$clip" "${gpt2_common[@]}" --set data.batch_size=8 --set "clip_grad_norm=$clip" \
          --set 'model.options={ vocab_multiple = 64, dropout = 0.0, n_layer = 24, n_embd = 2048, n_head = 16 }'
      done
      ;;
    torch)
      for mode in ${TORCH_MODES:-compile eager}; do
        for p in 0.0 0.1; do
          python3 bench/compare/train_step.py --model gpt2 --mode "$mode" --dropout "$p" --steps 50 --warmup 20 \
            --json "$out/torch.jsonl" > /dev/null 2>&1
          python3 -c "import json; r = [json.loads(l) for l in open('$out/torch.jsonl')][-1]; print(f\"torch gpt2 $mode dropout $p: {r['ms_per_step']:.2f} ms/step\" + (f\" ({r['error']})\" if r.get('error') else ''))"
        done
      done
      ;;
    *) echo "unknown part '$part' (gpt2, images, gpt1.3b, torch)"; exit 2 ;;
  esac
done
