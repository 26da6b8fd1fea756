// Whole-training-step benchmark: GPT-2 124M / 350M, ViT-B/16 / ViT-L/16 and ResNet-50 trained through
// the Engine in bf16 with fp32 master weights and AdamW, on synthetic inputs made once on the GPU.
// Prints ms/step, tokens/s or images/s, MFU and peak memory per model; --json FILE writes one JSON
// object per line for bench/compare/train_steps.py, which runs PyTorch's reference beside it.
// See docs/benchmarks.md for the method (what a step holds, the FLOP formulas, timing and memory).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "colossal/amp/mixed_precision_optimizer.h"  // AmpOptions, AmpMode
#include "colossal/core/allocator.h"                 // memory_stats, reset_peak_memory
#include "colossal/core/build_config.h"              // COLOSSAL_WITH_CUPTI
#include "colossal/core/cuda_device.h"               // is_available, Event, current_stream, properties
#include "colossal/core/host_profiler.h"             // HostProfiler
#include "colossal/core/kernel_trace.h"              // KernelTrace, summarize
#include "colossal/core/random.h"                    // Generator, randint, randn
#include "colossal/engine/engine.h"                  // Engine, EngineOptions
#include "colossal/nn/models/gpt2.h"                 // GPT2, lm_cross_entropy
#include "colossal/nn/models/resnet.h"               // ResNet
#include "colossal/nn/models/vit.h"                  // VisionTransformer
#include "colossal/ops/nn_functional.h"              // cross_entropy
#include "colossal/optim/adam.h"                     // AdamW

using namespace colossal;

namespace {

/// H100 SXM's dense bf16 tensor-core peak (NVIDIA's data sheet, 1979 TFLOP/s with sparsity); the
/// H200 has the same. MFU divides by this unless --peak-tflops says otherwise.
constexpr double kDefaultPeakTflops = 989.4;
constexpr const char* kModelNames[] = {"gpt2", "gpt2-medium", "vit_base_patch16_224", "vit_large_patch16_224",
                                       "resnet50"};

enum class Family { gpt2, vit, resnet };

/// One benchmark case: a model preset at its default shape (docs/benchmarks.md) or the command line's.
struct Case {
  std::string name;
  Family family = Family::gpt2;
  int64_t batch = 0;
  int64_t seq = 0;            ///< tokens per sequence (GPT-2)
  int64_t image_size = 224;   ///< square images (ViT, ResNet)
  bool channels_last = true;  ///< ResNet's activation layout
  double dropout = 0.0;       ///< GPT-2's dropout probability (--dropout)
};

struct Options {
  std::vector<std::string> models;
  std::optional<int64_t> batch;
  std::optional<int64_t> seq;
  double dropout = 0.0;
  int steps = 20;
  int warmup = 5;
  double peak_tflops = kDefaultPeakTflops;
  std::string json_path;
  /// cpu runs the same steps on the CPU backend (host-clock timing): a smoke test at small sizes.
  bool cpu = false;
  /// After timing, trace one more step with CUPTI and print its top kernels (0: no trace).
  int trace_top = 0;
  /// ResNet's activations in channels_last (nhwc), as the PyTorch reference runs it; --layout nchw
  /// measures the other layout.
  bool channels_last = true;
  /// Sample the host's stacks during the timed steps into this file (empty: no profile).
  std::string host_profile;
};

struct Result {
  Case c;
  int64_t params = 0;
  double flops_per_step = 0;
  std::string flop_formula;
  double ms_per_step = 0;       ///< CUDA events around the timed steps, divided by their number
  double wall_ms_per_step = 0;  ///< host clock over the same steps (to the final synchronize)
  /// Host clock until the last step was queued: near ms_per_step means the host, not the GPU, sets
  /// the pace (launch-bound); well under it means the GPU is never left waiting for work.
  double enqueue_ms_per_step = 0;
  double forward_ms = 0;  ///< forward + loss alone (the graph built, then dropped), CUDA events
  double peak_memory_bytes = 0;
  double loss_first = 0;  ///< after the first warm-up step
  double loss_last = 0;   ///< after the last timed step
  std::string error;

  double samples_per_step() const { return c.family == Family::gpt2 ? double(c.batch) * c.seq : double(c.batch); }
  double throughput() const { return ms_per_step > 0 ? samples_per_step() / (ms_per_step * 1e-3) : 0; }
  const char* unit() const { return c.family == Family::gpt2 ? "tokens/s" : "images/s"; }
};

// ---- model presets (what is timed is the same as bench/compare/train_step.py builds)

nn::models::GPT2Config gpt2_config(const Case& c) {
  nn::models::GPT2Config g =
      c.name == "gpt2" ? nn::models::GPT2Config::gpt2_124m() : nn::models::GPT2Config::gpt2_350m();
  // No dropout unless --dropout (nanoGPT's and llm.c's pre-training setting) and the vocabulary padded
  // to 50304, a multiple of 64 (nanoGPT, llm.c): the PyTorch reference does the same.
  g.dropout = c.dropout;
  g.vocab_multiple = 64;
  return g;
}

nn::models::ViTConfig vit_config(const Case& c) {
  // timm's presets: no dropout or drop path by default, 1000 classes.
  return c.name == "vit_base_patch16_224" ? nn::models::ViTConfig::vit_base_patch16_224(1000)
                                          : nn::models::ViTConfig::vit_large_patch16_224(1000);
}

// ---- FLOPs per training step ("FLOPs and MFU" in docs/benchmarks.md says why these formulas)

/// GPT-2: 6 N + 12 L d T per token (PaLM's appendix B, as nanoGPT's estimate_mfu and llm.c count),
/// N the parameters less the position embedding (a lookup, no matmul; the tied wte is counted once,
/// as the lm_head GEMM), and the attention term counting the full T x T score matrix (not halved
/// for the causal mask).
double gpt2_flops(const nn::models::GPT2Config& g, int64_t batch, int64_t seq) {
  const double n = double(g.num_parameters() - g.n_positions * g.n_embd);
  const double per_token = 6.0 * n + 12.0 * double(g.n_layer) * double(g.n_embd) * double(seq);
  return per_token * double(batch) * double(seq);
}

/// ViT: 3 x the forward's matmul FLOPs (backward is twice the forward), counted from the layer
/// shapes: patch projection, per block qkv, scores, probabilities x values, proj and the MLP, and
/// the head on the class token. Norms, softmax and GELU are not counted.
double vit_flops(const nn::models::ViTConfig& v, int64_t batch) {
  const double d = double(v.embed_dim), tokens = double(v.num_patches() + 1);
  const double hidden = double(int64_t(d * v.mlp_ratio));
  const double patch = 2.0 * double(v.num_patches()) * double(v.in_chans * v.patch_size * v.patch_size) * d;
  const double block = 2.0 * tokens * d * 3 * d          // qkv
                       + 2.0 * tokens * tokens * d       // q k^T
                       + 2.0 * tokens * tokens * d       // p v
                       + 2.0 * tokens * d * d            // proj
                       + 2.0 * tokens * d * hidden * 2;  // fc1, fc2
  const double head = 2.0 * d * double(v.num_classes);
  return 3.0 * double(batch) * (patch + double(v.depth) * block + head);
}

/// ResNet (bottleneck, v1.5): 3 x the forward's FLOPs counted from the layer shapes, 2 per
/// multiply-accumulate of every convolution and the fc; batch norm, ReLU, pooling and the residual
/// adds are not counted. At 224 this is 2 x 4.09 G MACs = 8.18 GFLOPs forward per image: the "4.1
/// GFLOPs" usually quoted for ResNet-50 are multiply-accumulates.
double resnet_flops(const nn::models::ResNetConfig& r, int64_t batch, int64_t image_size) {
  auto out_size = [](int64_t in, int64_t kernel, int64_t stride, int64_t pad) {
    return (in + 2 * pad - kernel) / stride + 1;
  };
  double macs = 0;
  auto conv = [&](int64_t in_ch, int64_t out_ch, int64_t kernel, int64_t out_hw) {
    macs += double(out_hw) * double(out_hw) * double(out_ch) * double(in_ch) * double(kernel * kernel);
  };
  int64_t hw = out_size(image_size, 7, 2, 3);
  conv(r.in_chans, r.width, 7, hw);
  hw = out_size(hw, 3, 2, 1);  // max pool
  int64_t in_planes = r.width;
  for (size_t s = 0; s < 4; ++s) {
    const int64_t planes = r.width << s;
    for (int64_t b = 0; b < r.layers[s]; ++b) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      const int64_t out_hw = out_size(hw, 3, stride, 1);
      conv(in_planes, planes, 1, hw);
      conv(planes, planes, 3, out_hw);
      conv(planes, planes * 4, 1, out_hw);
      if (stride != 1 || in_planes != planes * 4) conv(in_planes, planes * 4, 1, out_hw);  // downsample
      in_planes = planes * 4;
      hw = out_hw;
    }
  }
  macs += double(in_planes) * double(r.num_classes);  // fc
  return 3.0 * double(batch) * 2.0 * macs;
}

/// FLOPs per step, the parameter count and the formula's name, without building the model.
void count_flops(Result& r) {
  const Case& c = r.c;
  switch (c.family) {
    case Family::gpt2: {
      const auto g = gpt2_config(c);
      r.params = g.num_parameters();
      r.flops_per_step = gpt2_flops(g, c.batch, c.seq);
      r.flop_formula = "(6N + 12 L d T) x tokens, N without wpe";
      return;
    }
    case Family::vit: {
      const auto v = vit_config(c);
      r.params = v.num_parameters();
      r.flops_per_step = vit_flops(v, c.batch);
      r.flop_formula = "3 x forward matmul FLOPs from layer shapes";
      return;
    }
    case Family::resnet: {
      // No closed form in ResNetConfig: count a CPU-built model's (25M parameters, about a second).
      const nn::models::ResNet model(nn::models::ResNetConfig::resnet50(1000));
      r.params = 0;
      for (const Tensor& p : model.parameters()) r.params += p.numel();
      r.flops_per_step = resnet_flops(nn::models::ResNetConfig::resnet50(1000), c.batch, c.image_size);
      r.flop_formula = "3 x 2 x conv/fc MACs from layer shapes";
      return;
    }
  }
}

// ---- the measurement

/// Builds the model in f32 on the CPU (the same initialisation every run), moves it to `device` and
/// returns the Engine that trains it in bf16 with fp32 masters and AdamW; also the parameter count.
std::unique_ptr<engine::Engine> make_engine(const Case& c, Device device, core::Generator& init, int64_t& params) {
  std::shared_ptr<nn::Module> model;
  engine::Criterion criterion = [](const Tensor& logits, const Tensor& target) {
    return ops::cross_entropy(logits, target);
  };
  switch (c.family) {
    case Family::gpt2:
      // Dropout is 0, so the dropout generator is never drawn from.
      model = std::make_shared<nn::models::GPT2>(gpt2_config(c), &init);
      criterion = [](const Tensor& logits, const Tensor& target) {
        return nn::models::lm_cross_entropy(logits, target);
      };
      break;
    case Family::vit:
      model = std::make_shared<nn::models::VisionTransformer>(vit_config(c), &init);
      break;
    case Family::resnet: {
      nn::models::ResNetConfig config = nn::models::ResNetConfig::resnet50(1000);
      config.channels_last = c.channels_last;
      model = std::make_shared<nn::models::ResNet>(config, &init);
      break;
    }
  }
  model->to(device);
  model->train();
  params = 0;
  for (const Tensor& p : model->parameters()) params += p.numel();
  // One group, decay on every parameter: the reference's torch.optim.AdamW(model.parameters(), ...).
  optim::AdamOptions adamw{.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  auto optimizer = std::make_shared<optim::AdamW>(model->parameters(), adamw);
  engine::EngineOptions options;
  options.amp = amp::AmpOptions::for_mode(amp::AmpMode::bf16);
  // The criteria are ops::cross_entropy on class targets: f32 loss from the bf16 logits directly.
  options.amp->output_to_f32 = false;
  return std::make_unique<engine::Engine>(model, optimizer, criterion, options);
}

void measure(Result& r, const Options& o, Device device) {
  const Case& c = r.c;
  core::Generator init(1234), data(42);
  int64_t params = 0;
  std::unique_ptr<engine::Engine> engine = make_engine(c, device, init, params);
  r.params = params;

  // Synthetic inputs, made once on the device: random token ids and targets below GPT-2's real
  // vocabulary, or standard-normal f32 images and class labels (the Engine casts images to bf16).
  Tensor input, target;
  if (c.family == Family::gpt2) {
    const int64_t vocab = gpt2_config(c).vocab_size;
    input = core::randint(0, vocab, {c.batch, c.seq}, TensorOptions(DType::i64, device), &data);
    target = core::randint(0, vocab, {c.batch, c.seq}, TensorOptions(DType::i64, device), &data);
  } else {
    input = core::randn({c.batch, 3, c.image_size, c.image_size}, TensorOptions(DType::f32, device), &data);
    target = core::randint(0, 1000, {c.batch}, TensorOptions(DType::i64, device), &data);
  }

  // Warm-up: the first steps allocate the optimizer state, autotune each GEMM shape and fill the
  // allocator's pool; one host read of the first loss is allowed here.
  Tensor loss;
  for (int i = 0; i < o.warmup; ++i) {
    loss = engine->step(input, target);
    if (i == 0) r.loss_first = loss.item<double>();
  }
  if (device.is_cpu()) {
    // The CPU backend finishes each op before returning: the host clock is the step time.
    core::reset_peak_memory(device);
    const auto wall_start = std::chrono::steady_clock::now();
    for (int i = 0; i < o.steps; ++i) loss = engine->step(input, target);
    r.ms_per_step =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall_start).count() / o.steps;
    r.wall_ms_per_step = r.ms_per_step;
    r.peak_memory_bytes = double(core::memory_stats(device).peak_allocated_bytes);
    r.loss_last = loss.item<double>();
    return;
  }
  core::cuda::synchronize(device);
  core::reset_peak_memory(device);

  // The timed steps are queued back to back with no host read: Engine::step returns the loss as a
  // device tensor, and bf16 mode has no overflow check, so nothing waits for the GPU until `stop`.
  const core::Stream stream = core::cuda::current_stream(device);
  core::cuda::Event start(true), stop(true);
  const auto wall_start = std::chrono::steady_clock::now();
  start.record(stream);
  {
    std::unique_ptr<core::HostProfiler> profiler;
    if (!o.host_profile.empty()) profiler = std::make_unique<core::HostProfiler>();
    for (int i = 0; i < o.steps; ++i) loss = engine->step(input, target);
    if (profiler) {
      profiler->stop();
      std::fprintf(stderr, "host profile: %d samples in %s\n", profiler->write(o.host_profile), o.host_profile.c_str());
    }
  }
  stop.record(stream);
  const auto enqueued = std::chrono::steady_clock::now();
  stop.synchronize();
  const auto wall_stop = std::chrono::steady_clock::now();

  r.ms_per_step = start.elapsed_ms(stop) / o.steps;
  r.wall_ms_per_step = std::chrono::duration<double, std::milli>(wall_stop - wall_start).count() / o.steps;
  r.enqueue_ms_per_step = std::chrono::duration<double, std::milli>(enqueued - wall_start).count() / o.steps;
  r.peak_memory_bytes = double(core::memory_stats(device).peak_allocated_bytes);
  r.loss_last = loss.item<double>();

  // Where the step's time goes: forward + loss alone (backward + optimizer is the rest).
  constexpr int kForwardRuns = 5;
  core::cuda::Event forward_start(true), forward_stop(true);
  forward_start.record(stream);
  for (int i = 0; i < kForwardRuns; ++i) engine->criterion(engine->forward(input), target);
  forward_stop.record(stream);
  forward_stop.synchronize();
  r.forward_ms = forward_start.elapsed_ms(forward_stop) / kForwardRuns;

  if (o.trace_top > 0) {
#if COLOSSAL_WITH_CUPTI
    core::cuda::KernelTrace trace;
    trace.start();
    loss = engine->step(input, target);
    const std::vector<core::cuda::KernelRecord> records = trace.stop();
    std::printf("\n%s, one step (%s):\n%s", c.name.c_str(), c.family == Family::gpt2 ? "tokens" : "images",
                core::cuda::summarize(records, o.trace_top).c_str());
    std::fflush(stdout);
#else
    std::fprintf(stderr, "train_step_bench: built without CUPTI, --trace ignored\n");
#endif
  }
}

// ---- command line and output

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "train_step_bench: %s\n"
               "usage: train_step_bench [--model NAME|all] [--batch B] [--seq T] [--steps N] [--warmup N]\n"
               "                        [--peak-tflops F] [--json FILE] [--device cuda|cpu] [--trace TOP]\n"
               "                        [--layout nhwc|nchw] [--host-profile FILE] [--dropout P]\n"
               "  NAME: gpt2 (B16 T1024), gpt2-medium (B8 T1024), vit_base_patch16_224 (B128),\n"
               "        vit_large_patch16_224 (B64), resnet50 (B128); all (the default) runs each.\n"
               "  --batch and --seq override every selected model's (--seq: GPT-2 only, <= 1024).\n"
               "  --device cpu: the same steps on the CPU backend, a smoke test at small sizes.\n"
               "  --trace TOP: after timing, one more step traced with CUPTI; prints the GPU's busy and idle\n"
               "        time and the TOP kernels by summed duration.\n"
               "  --layout nhwc|nchw: ResNet's activation layout (default nhwc, channels_last).\n"
               "  --dropout P: GPT-2's dropout probability (default 0: none).\n"
               "  --host-profile FILE: sample the host's stacks during the timed steps (SIGPROF) into FILE,\n"
               "        one line of module+offset frames per sample (tools/host-profile-report symbolises it).\n",
               problem.c_str());
  std::exit(2);
}

int64_t parse_int(const std::string& flag, const std::string& value, int64_t min) {
  try {
    size_t used = 0;
    const int64_t v = std::stoll(value, &used);
    if (used == value.size() && v >= min) return v;
  } catch (const std::exception&) {
  }
  usage(fmt::format("{} needs an integer >= {}, got '{}'", flag, min, value));
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") usage("whole-training-step benchmark");
    if (i + 1 >= argc) usage(fmt::format("{} needs a value", flag));
    const std::string value = argv[++i];
    if (flag == "--model") {
      if (value == "all") {
        o.models.assign(std::begin(kModelNames), std::end(kModelNames));
      } else {
        bool known = false;
        for (const char* name : kModelNames) known = known || value == name;
        if (!known) usage(fmt::format("unknown model '{}'", value));
        o.models.push_back(value);
      }
    } else if (flag == "--batch") {
      o.batch = parse_int(flag, value, 1);
    } else if (flag == "--seq") {
      o.seq = parse_int(flag, value, 1);
      if (*o.seq > 1024) usage(fmt::format("--seq {} exceeds GPT-2's 1024 positions", *o.seq));
    } else if (flag == "--steps") {
      o.steps = int(parse_int(flag, value, 1));
    } else if (flag == "--warmup") {
      o.warmup = int(parse_int(flag, value, 1));
    } else if (flag == "--peak-tflops") {
      try {
        o.peak_tflops = std::stod(value);
      } catch (const std::exception&) {
        o.peak_tflops = 0;
      }
      if (!(o.peak_tflops > 0)) usage(fmt::format("--peak-tflops needs a positive number, got '{}'", value));
    } else if (flag == "--dropout") {
      char* end = nullptr;
      o.dropout = std::strtod(value.c_str(), &end);
      if (end == value.c_str() || *end != '\0' || !(o.dropout >= 0 && o.dropout < 1)) {
        usage(fmt::format("--dropout needs a probability in [0, 1), got '{}'", value));
      }
    } else if (flag == "--json") {
      o.json_path = value;
    } else if (flag == "--trace") {
      o.trace_top = int(parse_int(flag, value, 1));
    } else if (flag == "--device") {
      if (value != "cuda" && value != "cpu") usage(fmt::format("--device is cuda or cpu, got '{}'", value));
      o.cpu = value == "cpu";
    } else if (flag == "--host-profile") {
      o.host_profile = value;
    } else if (flag == "--layout") {
      if (value != "nhwc" && value != "nchw") usage(fmt::format("--layout is nhwc or nchw, got '{}'", value));
      o.channels_last = value == "nhwc";
    } else {
      usage(fmt::format("unknown option '{}'", flag));
    }
  }
  if (o.models.empty()) o.models.assign(std::begin(kModelNames), std::end(kModelNames));
  return o;
}

Case make_case(const std::string& name, const Options& o) {
  Case c;
  c.name = name;
  c.channels_last = o.channels_last;
  c.dropout = o.dropout;
  if (name == "gpt2" || name == "gpt2-medium") {
    c.family = Family::gpt2;
    c.batch = name == "gpt2" ? 16 : 8;
    c.seq = o.seq.value_or(1024);
  } else if (name == "resnet50") {
    c.family = Family::resnet;
    c.batch = 128;
  } else {
    c.family = Family::vit;
    c.batch = name == "vit_base_patch16_224" ? 128 : 64;
  }
  if (o.batch) c.batch = *o.batch;
  return c;
}

nlohmann::json to_json(const Result& r, const Options& o, const std::string& device) {
  nlohmann::json j = {
      {"impl", "colossal"},
      {"mode", "colossal"},
      {"model", r.c.name},
      {"batch", r.c.batch},
      {"seq", r.c.family == Family::gpt2 ? nlohmann::json(r.c.seq) : nlohmann::json(nullptr)},
      {"image_size", r.c.family == Family::gpt2 ? nlohmann::json(nullptr) : nlohmann::json(r.c.image_size)},
      {"precision", "bf16 model, fp32 master weights"},
      {"optimizer", "AdamW (fused multi-tensor)"},
      {"steps", o.steps},
      {"warmup", o.warmup},
      {"params", r.params},
      {"flops_per_step", r.flops_per_step},
      {"flop_formula", r.flop_formula},
      {"peak_tflops", o.peak_tflops},
      {"device", device},
      {"throughput_unit", r.unit()}};
  if (!r.error.empty()) {
    j["error"] = r.error;
    return j;
  }
  j["error"] = nullptr;
  j["ms_per_step"] = r.ms_per_step;
  j["wall_ms_per_step"] = r.wall_ms_per_step;
  j["enqueue_ms_per_step"] = r.enqueue_ms_per_step;
  j["forward_ms"] = r.forward_ms;
  j["throughput"] = r.throughput();
  j["tflops"] = r.flops_per_step / (r.ms_per_step * 1e-3) / 1e12;
  j["mfu"] = r.flops_per_step / (r.ms_per_step * 1e-3) / (o.peak_tflops * 1e12);
  j["peak_memory_bytes"] = r.peak_memory_bytes;
  j["loss_first"] = r.loss_first;
  j["loss_last"] = r.loss_last;
  return j;
}

std::string shape_label(const Case& c) {
  return c.family == Family::gpt2 ? fmt::format("B{} T{}", c.batch, c.seq)
                                  : fmt::format("B{} {}px", c.batch, c.image_size);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::vector<Result> results;
  for (const std::string& name : o.models) {
    Result r;
    r.c = make_case(name, o);
    count_flops(r);
    results.push_back(r);
  }

  if (!o.cpu && !core::cuda::is_available()) {
    // Nothing to time; the FLOP counts are still worth seeing (and checking against the reference).
    std::printf("train_step_bench: no CUDA GPU, printing the FLOPs per step only\n");
    std::printf("%-24s %-14s %14s %18s  %s\n", "model", "shape", "params", "GFLOP/step", "formula");
    for (const Result& r : results) {
      std::printf("%-24s %-14s %14lld %18.1f  %s\n", r.c.name.c_str(), shape_label(r.c).c_str(),
                  static_cast<long long>(r.params), r.flops_per_step / 1e9, r.flop_formula.c_str());
    }
    return 0;
  }

  const Device device = o.cpu ? core::kCpu : core::cuda_device(0);
  std::string device_name = "CPU";
  if (!o.cpu) {
    const auto props = core::cuda::properties(0);
    device_name = fmt::format("{} ({} SMs)", props.name, props.multiprocessor_count);
  }
  std::ofstream json;
  if (!o.json_path.empty()) {
    json.open(o.json_path);
    if (!json) usage(fmt::format("cannot write --json file '{}'", o.json_path));
  }
  for (Result& r : results) {
    try {
      measure(r, o, device);
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    // Each model's memory goes back to the pool before the next one is built.
    if (!o.cpu) core::cuda::synchronize(device);
    if (json) json << to_json(r, o, device_name).dump() << "\n" << std::flush;
    if (!r.error.empty()) std::fprintf(stderr, "%s: %s\n", r.c.name.c_str(), r.error.c_str());
  }

  std::printf("\ncolossal training steps on %s: bf16 model, fp32 master weights, AdamW;\n", device_name.c_str());
  std::printf("%d warm-up + %d timed steps; MFU against %.1f TFLOP/s\n\n", o.warmup, o.steps, o.peak_tflops);
  std::printf("%-24s %-14s %10s %20s %9s %7s %10s %9s %10s %10s\n", "model", "shape", "ms/step", "throughput",
              "TFLOP/s", "MFU", "peak GiB", "loss", "fwd ms", "host ms");
  for (const Result& r : results) {
    if (!r.error.empty()) {
      std::printf("%-24s %-14s %10s  error: %.80s\n", r.c.name.c_str(), shape_label(r.c).c_str(), "n/a",
                  r.error.c_str());
      continue;
    }
    const double tflops = r.flops_per_step / (r.ms_per_step * 1e-3) / 1e12;
    std::printf("%-24s %-14s %10.2f %11.0f %-8s %9.1f %6.1f%% %10.2f %9.3f %10.2f %10.2f\n", r.c.name.c_str(),
                shape_label(r.c).c_str(), r.ms_per_step, r.throughput(), r.unit(), tflops,
                100.0 * tflops / o.peak_tflops, r.peak_memory_bytes / double(1 << 30), r.loss_last, r.forward_ms,
                r.enqueue_ms_per_step);
  }
  bool any_error = false;
  for (const Result& r : results) any_error = any_error || !r.error.empty();
  return any_error ? 1 : 0;
}
