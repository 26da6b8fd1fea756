#!/usr/bin/env bash
# `colossal train` beside train_step_bench (the same model, batch and precision: bf16 with fp32
# masters, AdamW) and beside PyTorch's step, on one GPU in one call: issue 18's table in
# docs/benchmarks.md. ms/step of a `colossal train` run is the metrics' wall_s slope over logged
# steps 40-110 of 120 (random tokens or synthetic images; the configs' clipping on, 1.0).
#
#   tools/gpu-check --run bench/compare/cli_vs_bench.sh [gpt2] [images] [cifar] [gpt1.3b] [torch]
#
# gpt2: GPT-2 124M B16 T1024, dropout 0 and 0.1, through the bench and the CLI (clip 1.0 and 0).
# images: ViT-B/16 (B128) and ResNet-50 (B128) at 224 px, the bench beside the CLI on synthetic images.
# cifar: the tutorial's configs/vit_b16_cifar10.toml (B256, AutoAugment, mixup, fp16 torch; accumulation
#   1, no test passes) on stand-in CIFAR-10 files (random bytes in the binary format, written once
#   to $OUT/cifar10) beside the same config on synthetic 224-px images without augmentation (the GPU's
#   pace), on 1 GPU and at dp=2 (colossal run --nproc_per_node 2), data.num_workers 4 and 14; then
#   the loader alone (loader_bench: per-sample and staged images/s per worker count). Needs 2 GPUs
#   for the dp=2 rows.
# gpt1.3b: GPT L24 C2048 H16 B8 T1024 through the CLI with and without clipping.
# torch: bench/compare/train_step.py GPT-2 compile and eager (TORCH_MODES), dropout 0 and 0.1.
set -uo pipefail
cd "$(dirname "$0")/../.."
parts=("$@")
[[ ${#parts[@]} == 0 ]] && parts=(gpt2 images cifar gpt1.3b torch)
colossal=${COLOSSAL:-build-gpu/src/colossal/cli/colossal}
bench=${BENCH:-build-gpu/bench/train_step/train_step_bench}
loader_bench=${LOADER_BENCH:-build-gpu/bench/loader/loader_bench}
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

launch=()  # a launcher in front of colossal train (the cifar part's dp=2 rows)
last_ms=nan
cli() {  # name, then colossal train arguments; sets last_ms
  local name=$1
  shift
  last_ms=nan
  if "${launch[@]}" "$colossal" train "$@" --set train.max_steps=120 --set train.log_interval=10 \
    --set train.progress=false --metrics "$out/$name.jsonl" > "$out/$name.log" 2>&1; then
    last_ms=$(ms_per_step "$out/$name.jsonl")
    echo "cli   $name: $last_ms ms/step"
  else
    echo "cli   $name: FAILED"
    tail -5 "$out/$name.log"
  fi
  rm -f "$out/$name.jsonl"
}

stand_in_cifar10() {  # folder: CIFAR-10's six binary files of random bytes (labels 0..9), once
  python3 bench/compare/stand_in_cifar10.py "$1"
}

ratio_cells() {  # ms, baseline ms: "  ms  ratio"
  python3 -c "import sys; a, b = sys.argv[1:3]; r = f'{float(a) / float(b):.3f}' if 'nan' not in (a, b) else '-'; print(f'{a:>12} {r:>8}', end='')" "$1" "$2"
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
      image_common=(--set bf16=true --set 'fp16.mode="off"' --set gradient_accumulation=1 --set clip_grad_norm=1.0
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
    cifar)
      stand_in_cifar10 "$out/cifar10"
      export NCCL_NVLS_ENABLE=0
      cifar_common=(--config configs/vit_b16_cifar10.toml --set gradient_accumulation=1 --set train.test_interval=0)
      synthetic=(--set 'data.dataset="synthetic"' --set 'data.path=""' --set 'data.transforms=[]'
        --set 'data.options={ size = 50000, test_size = 0, image_size = 224, channels = 3, num_classes = 10 }')
      declare -A cifar_ms
      for dp in 1 2; do
        launch=()
        [[ $dp == 2 ]] && launch=("$colossal" run --nproc_per_node 2 --)
        cli "cifar_synthetic_dp$dp" "${cifar_common[@]}" "${synthetic[@]}" --set "parallel.data=$dp"
        cifar_ms[synthetic,$dp]=$last_ms
        for workers in 4 14; do
          cli "cifar_w${workers}_dp$dp" "${cifar_common[@]}" --set "data.path=\"$out/cifar10\"" \
            --set "data.num_workers=$workers" --set "parallel.data=$dp"
          cifar_ms[w$workers,$dp]=$last_ms
        done
      done
      launch=()
      echo
      echo "configs/vit_b16_cifar10.toml, ms/iteration, B256 per GPU (ratio to the synthetic run; issue 18 asks <= 1.10)"
      printf '%-36s %12s %8s %12s %8s\n' run "1 GPU" ratio "dp=2" ratio
      for row in synthetic w4 w14; do
        label="stand-in CIFAR-10, ${row#w} workers"
        [[ $row == synthetic ]] && label="synthetic 224 px, no augmentation"
        printf '%-36s' "$label"
        for dp in 1 2; do
          printf ' '
          ratio_cells "${cifar_ms[$row,$dp]}" "${cifar_ms[synthetic,$dp]}"
        done
        echo
      done
      echo
      echo "the training loader alone (one GPU's share; a step of T ms needs 256000 / T images/s):"
      "$loader_bench" --config configs/vit_b16_cifar10.toml --set "data.path=\"$out/cifar10\"" --workers 1,2,4,8,14 \
        --batches 30 --warmup 5 2>&1 | grep -v '^data:'
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
    *) echo "unknown part '$part' (gpt2, images, cifar, gpt1.3b, torch)"; exit 2 ;;
  esac
done
