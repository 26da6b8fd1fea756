// GPU kernel benchmark: measures the device's ceilings (a large device-to-device copy, a large bf16
// GEMM) and then each kernel's achieved GB/s or TFLOP/s beside them, at sizes that fill an H100.
// Prints one table; --json FILE also writes the rows for bench/compare/kernels.py to pair with
// PyTorch's numbers from the same machine and run. Each row has two times: `ms`, CUDA events around
// back-to-back calls (what a caller gets, host work between launches included), and, where CUPTI is
// built in, `kernel ms`, the summed durations of the GPU work the calls launched (what the kernels
// themselves take); the % ceiling columns are given for both, the kernel one against the copy's
// own kernel time. --breakdown prints, per row, the kernels its calls launched. A last table gives
// the host's own time per call of common ops on tiny tensors (dispatch, allocation, launch), which
// bounds how fast small batches can run; --host-profile FILE samples the host's stacks meanwhile
// (tools/host-profile-report symbolises them).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "colossal/core/build_config.h"   // COLOSSAL_WITH_CUPTI
#include "colossal/core/host_profiler.h"  // HostProfiler (--host-profile)
#include "colossal/core/kernel_trace.h"   // KernelTrace, summarize
#include "colossal/ops.h"
#include "colossal/ops/elementwise_kernels.h"  // unary_backward_stub (the GELU derivative row)
#include "colossal/ops/linalg_kernels.h"       // batched_gemm_stub, fused_gemm_stub (epilogue rows)
#include "colossal/optim/adam.h"               // AdamW

using namespace colossal;

namespace {

struct Row {
  std::string name;
  double ms = 0;         // median time per call
  double bytes = 0;      // bytes moved per call (0 for compute-bound rows)
  double flops = 0;      // floating-point operations per call (0 for memory-bound rows)
  double kernel_ms = 0;  // summed GPU durations (CUPTI) per call; 0 without CUPTI
  std::string error;     // set when the kernel is missing or failed
};

/// Median over `reps` samples (after warm-up) of the time per call, in milliseconds, timed with
/// CUDA events around `calls` back-to-back calls. One call between two events also times the host's
/// work before the launch (allocating the output, dispatch): the start event fires at once on an
/// idle stream and the GPU waits for the host. In training the host runs ahead of the GPU, so the
/// calls are queued back to back, as they are here; the first call's host gap is spread over the
/// rest (helper measurements on an H100: ~27 us of such gap on a 100 us layer_norm call).
double time_ms(const std::function<void()>& fn, int reps = 20, int calls = 10) {
  const Device gpu = core::cuda_device(0);
  const core::Stream stream = core::cuda::current_stream(gpu);
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> samples;
  for (int i = 0; i < reps; ++i) {
    core::cuda::Event start(true), stop(true);
    start.record(stream);
    for (int c = 0; c < calls; ++c) fn();
    stop.record(stream);
    stop.synchronize();
    samples.push_back(start.elapsed_ms(stop) / calls);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

Tensor random_gpu(const Shape& shape, DType dtype, uint64_t seed, double low = -1, double high = 1) {
  core::Generator gen(seed);
  Tensor t = core::empty(shape, TensorOptions(DType::f32, core::cuda_device(0)));
  core::uniform_(t, low, high, &gen);
  return t.to(dtype);
}

/// --breakdown: print, for each row, the kernels its calls launched (name, count, share of the time).
bool g_breakdown = false;

/// The GPU time per call of `calls` calls: the summed durations of every kernel, copy and memset
/// they launched (CUPTI activity records), so launch gaps between them do not count.
double kernel_ms([[maybe_unused]] const std::string& name, [[maybe_unused]] const std::function<void()>& fn,
                 [[maybe_unused]] int calls = 10) {
#if COLOSSAL_WITH_CUPTI
  core::cuda::synchronize(core::cuda_device(0));
  core::cuda::KernelTrace trace;
  trace.start();
  for (int c = 0; c < calls; ++c) fn();
  const std::vector<core::cuda::KernelRecord> records = trace.stop();
  double total_ns = 0;
  for (const core::cuda::KernelRecord& r : records) total_ns += double(r.end_ns - r.start_ns);
  if (g_breakdown)
    std::printf("-- %s (%d calls)\n%s\n", name.c_str(), calls, core::cuda::summarize(records, 8).c_str());
  return total_ns * 1e-6 / calls;
#else
  return 0;
#endif
}

Row measure(const std::string& name, double bytes, double flops, const std::function<void()>& fn) {
  Row row{name, 0, bytes, flops, 0, ""};
  try {
    row.ms = time_ms(fn);
  } catch (const std::exception& e) {
    row.error = e.what();
    if (auto cut = row.error.find(" ("); cut != std::string::npos) row.error.resize(cut);
    return row;
  }
  try {
    row.kernel_ms = kernel_ms(name, fn);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: no kernel time (%s)\n", name.c_str(), e.what());
  }
  return row;
}

/// Host microseconds per call of `fn`, run on tensors so small that the GPU finishes each kernel
/// before the host has launched the next: the loop's wall time is then the host's own work per
/// call (framework dispatch, allocation, the launch). Synchronised every `batch` calls, outside the
/// timed part, so the launch queue never fills (a full queue would make the host wait on the GPU).
/// Median over `reps` samples of `batch` calls each.
double host_us(const std::function<void()>& fn, int reps = 15, int batch = 200) {
  const Device gpu = core::cuda_device(0);
  for (int i = 0; i < 20; ++i) fn();
  core::cuda::synchronize(gpu);
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int c = 0; c < batch; ++c) fn();
    const auto stop = std::chrono::steady_clock::now();
    samples.push_back(std::chrono::duration<double, std::micro>(stop - start).count() / batch);
    core::cuda::synchronize(gpu);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

struct HostRow {
  std::string name;
  double us = 0;
};

/// The host-cost table: common ops of a training step at sizes where the GPU is idle most of the time.
std::vector<HostRow> host_rows(const std::string& profile_path) {
  const Device gpu = core::cuda_device(0);
  const TensorOptions bf16(DType::bf16, gpu);
  Tensor x = random_gpu({8, 1024}, DType::bf16, 40), other = random_gpu({8, 1024}, DType::bf16, 41);
  Tensor w = random_gpu({1024}, DType::bf16, 42), b = random_gpu({1024}, DType::bf16, 43);
  Tensor weight = random_gpu({1024, 1024}, DType::bf16, 44);
  std::vector<std::pair<std::string, std::function<void()>>> cases = {
      {"host: empty [8,1024] bf16",
       [&] {
         core::empty({8, 1024}, bf16);
       }},
      {"host: add [8,1024] bf16", [&] { ops::add(x, other); }},
      {"host: gelu [8,1024] bf16", [&] { ops::gelu(x); }},
      {"host: layer_norm [8,1024] bf16", [&] { ops::layer_norm(x, {1024}, w, b); }},
      {"host: linear [8,1024]x[1024,1024] bf16", [&] { ops::linear(x, weight, b); }},
  };
  std::unique_ptr<core::HostProfiler> profiler;
  if (!profile_path.empty()) profiler = std::make_unique<core::HostProfiler>(50);
  std::vector<HostRow> rows;
  for (const auto& [name, fn] : cases) rows.push_back({name, host_us(fn)});
  if (profiler) {
    profiler->stop();
    std::fprintf(stderr, "host profile: %d samples in %s\n", profiler->write(profile_path), profile_path.c_str());
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, host_profile;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--json" && i + 1 < argc) json_path = argv[++i];
    if (std::string(argv[i]) == "--host-profile" && i + 1 < argc) host_profile = argv[++i];
    if (std::string(argv[i]) == "--breakdown") g_breakdown = true;
  }
  if (!core::cuda::is_available()) {
    std::printf("gpu_kernels_bench: no CUDA GPU, nothing to measure\n");
    return 0;
  }
  const Device gpu = core::cuda_device(0);
  const auto props = core::cuda::properties(0);
  autograd::NoGradGuard no_grad;  // forward-only rows; backward rows build their own graphs
  std::vector<Row> rows;
  // First, before CUPTI attaches to the process (the kernel times below), since once attached it
  // adds its own work to every launch.
  const std::vector<HostRow> host = host_rows(host_profile);

  // ---- ceilings
  const int64_t copy_elems = int64_t{1} << 28;  // 512 MiB of bf16 each way
  Tensor copy_src = random_gpu({copy_elems}, DType::bf16, 1);
  Tensor copy_dst = core::empty({copy_elems}, TensorOptions(DType::bf16, gpu));
  rows.push_back(
      measure("ceiling: device copy 512 MiB", 2.0 * copy_src.nbytes(), 0, [&] { copy_dst.copy_(copy_src); }));
  const double copy_gbs = rows.back().bytes / (rows.back().ms * 1e-3) / 1e9;
  const double copy_kernel_gbs =
      rows.back().kernel_ms > 0 ? rows.back().bytes / (rows.back().kernel_ms * 1e-3) / 1e9 : 0;
  const int64_t big = 8192;
  Tensor ga = random_gpu({big, big}, DType::bf16, 2), gb = random_gpu({big, big}, DType::bf16, 3);
  rows.push_back(measure("ceiling: bf16 GEMM 8192^3", 0, 2.0 * big * big * big, [&] { ops::matmul(ga, gb); }));
  const double gemm_tflops = rows.back().error.empty() ? rows.back().flops / (rows.back().ms * 1e-3) / 1e12 : 0;
  ga = gb = Tensor();

  // ---- GEMMs
  auto gemm_row = [&](const char* name, int64_t m, int64_t k, int64_t n) {
    Tensor a = random_gpu({m, k}, DType::bf16, 4), b = random_gpu({k, n}, DType::bf16, 5);
    rows.push_back(measure(name, 0, 2.0 * m * n * k, [&] { ops::matmul(a, b); }));
  };
  gemm_row("gemm bf16 4096^3", 4096, 4096, 4096);
  gemm_row("gemm bf16 gpt2 qkv 16384x768x2304", 16384, 768, 2304);
  gemm_row("gemm bf16 gpt2 fc 16384x768x3072", 16384, 768, 3072);
  gemm_row("gemm bf16 gpt2 proj 16384x3072x768", 16384, 3072, 768);

  // ---- memory-bound kernels at GPT-2 activation sizes (B*T = 16384 rows)
  const int64_t rows_n = 16384, width = 768;
  Tensor x = random_gpu({rows_n, width}, DType::bf16, 6);
  Tensor w = random_gpu({width}, DType::bf16, 7), bias = random_gpu({width}, DType::bf16, 8);
  const double act_bytes = static_cast<double>(x.nbytes());
  rows.push_back(
      measure("layer_norm fwd bf16 16384x768", 2 * act_bytes, 0, [&] { ops::layer_norm(x, {width}, w, bias); }));
  {
    // The same at a size that fills the GPU (128 MiB each way), where launch and tail effects vanish.
    Tensor big_x = random_gpu({65536, 1024}, DType::bf16, 21);
    Tensor big_w = random_gpu({1024}, DType::bf16, 22), big_b = random_gpu({1024}, DType::bf16, 23);
    rows.push_back(measure("layer_norm fwd bf16 65536x1024", 2.0 * big_x.nbytes(), 0,
                           [&] { ops::layer_norm(big_x, {1024}, big_w, big_b); }));
  }
  Tensor wide = random_gpu({rows_n, 4 * width}, DType::bf16, 9);
  rows.push_back(measure("gelu fwd bf16 16384x3072", 2.0 * wide.nbytes(), 0,
                         [&] { ops::gelu(wide, ops::GeluApproximation::tanh); }));
  {
    // Exact (erf) GELU at ViT-B/16's MLP width (B128 x 197 tokens): forward, and the derivative
    // kernel alone (reads the upstream gradient and x, writes dx).
    Tensor vit = random_gpu({128 * 197, 3072}, DType::bf16, 24, -4, 4);
    Tensor vit_grad = random_gpu({128 * 197, 3072}, DType::bf16, 25);
    Tensor vit_dx = core::empty_like(vit);
    rows.push_back(measure("gelu erf fwd bf16 25216x3072", 2.0 * vit.nbytes(), 0, [&] { ops::gelu(vit); }));
    rows.push_back(measure("gelu erf bwd bf16 25216x3072", 3.0 * vit.nbytes(), 0, [&] {
      ops::unary_backward_stub(gpu, ops::UnaryOp::gelu, vit_dx, vit_grad, vit, Tensor(), 0.0, 0.0);
    }));
  }
  rows.push_back(
      measure("dropout fwd bf16 16384x3072", 2.0 * wide.nbytes(), 0, [&] { ops::dropout(wide, 0.1, true); }));
  Tensor scores = random_gpu({8 * 12 * 1024, 1024}, DType::bf16, 10);
  rows.push_back(measure("softmax fwd bf16 98304x1024", 2.0 * scores.nbytes(), 0, [&] { ops::softmax(scores, -1); }));
  {
    Tensor other = random_gpu({rows_n, 4 * width}, DType::bf16, 20);  // two distinct inputs: no cache reuse
    rows.push_back(measure("add bf16 16384x3072", 3.0 * wide.nbytes(), 0, [&] { ops::add(wide, other); }));
  }
  {
    // AdamW's elementwise core on 124M f32 parameters: p, g, m, v read; p, m, v written.
    const int64_t n = 124'439'808;
    Tensor p = random_gpu({n}, DType::f32, 11), g = random_gpu({n}, DType::f32, 12);
    Tensor m = random_gpu({n}, DType::f32, 13), v = random_gpu({n}, DType::f32, 14, 0.1, 1);
    rows.push_back(
        measure("adamw-style addcdiv_ f32 124M", 4.0 * p.nbytes(), 0, [&] { ops::addcdiv_(p, m, v, -1e-3); }));
  }
  {
    // The fused AdamW step over GPT-2 124M's 148 f32 parameters (wte, wpe, 12 blocks, ln_f): p, g,
    // m, v read; p, m, v written, as in the row above, but as the optimizer runs it.
    std::vector<Shape> shapes = {{50257, 768}, {1024, 768}};
    const std::vector<Shape> block = {{768}, {768}, {768, 2304}, {2304}, {768, 768},  {768},
                                      {768}, {768}, {768, 3072}, {3072}, {3072, 768}, {768}};
    for (int layer = 0; layer < 12; ++layer) shapes.insert(shapes.end(), block.begin(), block.end());
    shapes.push_back({768});  // ln_f
    shapes.push_back({768});
    std::vector<Tensor> params;
    double bytes = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      Tensor p = random_gpu(shapes[i], DType::f32, 100 + i);
      p.set_requires_grad(true);
      p.set_grad(random_gpu(shapes[i], DType::f32, 400 + i));
      bytes += 7.0 * static_cast<double>(p.nbytes());
      params.push_back(p);
    }
    optim::AdamW adamw(params, {.lr = 6e-4, .weight_decay = 0.1});
    rows.push_back(measure("fused adamw step f32 gpt2-124M 148 tensors", bytes, 0, [&] { adamw.step(); }));
  }
  {
    Tensor logits = random_gpu({8192, 50304}, DType::bf16, 15);
    Tensor targets = core::randint(0, 50257, {8192}, TensorOptions(DType::i64, gpu));
    rows.push_back(measure("cross_entropy fwd bf16 8192x50304", static_cast<double>(logits.nbytes()), 0,
                           [&] { ops::cross_entropy(logits, targets); }));
  }
  // ---- GPT-2's MLP at 16384 tokens (768 -> 3072 -> 768, bf16, weights [in, out] as Conv1D holds
  // them): forward + backward, as linear_gelu then linear, and as gelu_mlp, whose backward applies
  // the GELU gradient in the epilogue of the dh GEMM (Note [Fused GELU backward] in ops/linalg.cpp).
  // Six GEMMs of 2 x 16384 x 768 x 3072 FLOPs each.
  {
    autograd::EnableGradGuard grad;
    const int64_t hidden = 4 * width;
    Tensor mlp_x = random_gpu({rows_n, width}, DType::bf16, 24).set_requires_grad(true);
    Tensor w1 = random_gpu({width, hidden}, DType::bf16, 25, -0.05, 0.05).set_requires_grad(true);
    Tensor b1 = random_gpu({hidden}, DType::bf16, 26, -0.5, 0.5).set_requires_grad(true);
    Tensor w2 = random_gpu({hidden, width}, DType::bf16, 27, -0.03, 0.03).set_requires_grad(true);
    Tensor b2 = random_gpu({width}, DType::bf16, 28, -0.5, 0.5).set_requires_grad(true);
    Tensor grad_out = random_gpu({rows_n, width}, DType::bf16, 29);
    const double flops = 12.0 * rows_n * width * hidden;
    rows.push_back(measure("gpt2 mlp fwd+bwd bf16 16384x768x3072 composed", 0, flops, [&] {
      Tensor y = ops::linear(ops::linear_gelu(mlp_x, w1.t(), b1), w2.t(), b2);
      autograd::backward(y, grad_out);
    }));
    rows.push_back(measure("gpt2 mlp fwd+bwd bf16 16384x768x3072 gelu_mlp", 0, flops, [&] {
      Tensor y = ops::gelu_mlp(mlp_x, w1.t(), b1, w2.t(), b2);
      autograd::backward(y, grad_out);
    }));
  }
  {
    // The GEMM of that backward that yields the hidden gradient, dy [16384, 768] @ W2 with W2 the
    // transposed view of c_proj's [3072, 768] weight: plain, with the GELU gradient epilogue, and
    // with the one that also reduces the bias gradient (the record behind gelu_mlp's choice of the
    // former plus the separate sum of the last row; see the Note).
    const int64_t hidden = 4 * width;
    Tensor dy = random_gpu({rows_n, width}, DType::bf16, 30);
    Tensor proj = random_gpu({hidden, width}, DType::bf16, 31, -0.03, 0.03);
    Tensor pre = random_gpu({rows_n, hidden}, DType::bf16, 32, -3, 3);
    Tensor dh = core::empty({rows_n, hidden}, TensorOptions(DType::bf16, gpu));
    Tensor db = core::empty({hidden}, TensorOptions(DType::bf16, gpu));
    const double flops = 2.0 * rows_n * width * hidden;
    // A declined epilogue (the stub returns false) must show as a missing row, not as a fast one.
    const auto fused_or_throw = [&](const Tensor& out, const Tensor& a, const Tensor& b,
                                    const ops::GemmEpilogue& epilogue) {
      if (!ops::fused_gemm_stub(gpu, out, a, b, epilogue)) throw std::runtime_error("epilogue declined");
    };
    rows.push_back(measure("gemm bf16 gpt2 dh 16384x768x3072", 0, flops,
                           [&] { ops::batched_gemm_stub(gpu, dh, dy, proj.t(), 0.0); }));
    rows.push_back(measure("gemm bf16 gpt2 dh 16384x768x3072 +dgelu", 0, flops, [&] {
      fused_or_throw(dh, dy, proj.t(), ops::GemmEpilogue{.gelu_grad_pre_activation = pre});
    }));
    rows.push_back(measure("gemm bf16 gpt2 dh 16384x768x3072 +dgelu+bgrad", 0, flops, [&] {
      fused_or_throw(dh, dy, proj.t(), ops::GemmEpilogue{.gelu_grad_pre_activation = pre, .bias_grad = db});
    }));
    Tensor proj_out_in = random_gpu({width, hidden}, DType::bf16, 33, -0.03, 0.03);  // nn::Linear's layout
    rows.push_back(measure("gemm bf16 dh [out,in] weight +dgelu+bgrad", 0, flops, [&] {
      fused_or_throw(dh, dy, proj_out_in, ops::GemmEpilogue{.gelu_grad_pre_activation = pre, .bias_grad = db});
    }));
    rows.push_back(
        measure("sum bf16 16384x3072 over rows", static_cast<double>(dh.nbytes()), 0, [&] { ops::sum(dh, {0}); }));
  }
  // ---- attention (B8, H12, T1024, D64, causal, bf16): forward + backward
  {
    autograd::EnableGradGuard grad;
    const int64_t B = 8, H = 12, T = 1024, D = 64;
    Tensor q = random_gpu({B, H, T, D}, DType::bf16, 16).set_requires_grad(true);
    Tensor k = random_gpu({B, H, T, D}, DType::bf16, 17).set_requires_grad(true);
    Tensor v = random_gpu({B, H, T, D}, DType::bf16, 18).set_requires_grad(true);
    Tensor grad_out = random_gpu({B, H, T, D}, DType::bf16, 19);
    // Causal: half of the 4 B H T^2 D forward FLOPs; backward is 2.5x forward.
    const double fwd_flops = 4.0 * B * H * T * T * D / 2;
    rows.push_back(measure("attention fwd+bwd causal bf16 B8 H12 T1024 D64", 0, 3.5 * fwd_flops, [&] {
      Tensor out = ops::scaled_dot_product_attention(q, k, v, {.causal = true});
      autograd::backward(out, grad_out);
    }));
  }

  std::printf("\ncolossal GPU kernels on %s (%d SMs)\n", props.name.c_str(), props.multiprocessor_count);
  std::printf("ceilings: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s\n\n", copy_gbs, gemm_tflops);
  std::printf("%-48s %10s %12s %10s %10s %10s\n", "kernel", "ms", "achieved", "% ceiling", "kernel ms", "% ceiling");
  for (const Row& r : rows) {
    if (!r.error.empty()) {
      std::printf("%-48s %10s %s\n", r.name.c_str(), "n/a", r.error.c_str());
      continue;
    }
    if (r.flops > 0) {
      const double tflops = r.flops / (r.ms * 1e-3) / 1e12;
      const double kernel_tflops = r.kernel_ms > 0 ? r.flops / (r.kernel_ms * 1e-3) / 1e12 : 0;
      std::printf("%-48s %10.3f %7.1f TF/s %9.1f%% %10.3f %9.1f%%\n", r.name.c_str(), r.ms, tflops,
                  gemm_tflops > 0 ? 100 * tflops / gemm_tflops : 0, r.kernel_ms,
                  gemm_tflops > 0 ? 100 * kernel_tflops / gemm_tflops : 0);
    } else {
      const double gbs = r.bytes / (r.ms * 1e-3) / 1e9;
      const double kernel_gbs = r.kernel_ms > 0 ? r.bytes / (r.kernel_ms * 1e-3) / 1e9 : 0;
      std::printf("%-48s %10.3f %7.0f GB/s %9.1f%% %10.3f %9.1f%%\n", r.name.c_str(), r.ms, gbs, 100 * gbs / copy_gbs,
                  r.kernel_ms, copy_kernel_gbs > 0 ? 100 * kernel_gbs / copy_kernel_gbs : 0);
    }
  }
  std::printf("\n%-48s %10s\n", "host time per call (GPU idle)", "us");
  for (const HostRow& r : host) std::printf("%-48s %10.2f\n", r.name.c_str(), r.us);
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f) {
      std::fprintf(f, "[\n");
      for (size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        std::fprintf(f,
                     "  {\"name\": \"%s\", \"ms\": %.6f, \"kernel_ms\": %.6f, \"bytes\": %.0f, \"flops\": %.0f, "
                     "\"error\": %s}%s",
                     r.name.c_str(), r.ms, r.kernel_ms, r.bytes, r.flops, r.error.empty() ? "null" : "\"missing\"",
                     i + 1 < rows.size() ? ",\n" : "");
      }
      for (const HostRow& r : host) {
        std::fprintf(f, ",\n  {\"name\": \"%s\", \"host_us\": %.3f}", r.name.c_str(), r.us);
      }
      std::fprintf(f, "\n]\n");
      std::fclose(f);
    }
  }
  return 0;
}
