// CPU kernel throughput: GEMM as flops/s (FLOPs = 2 M N K) and the memory-bound kernels as bytes/s
// (bytes read + written once each, the least traffic the kernel can have). Compare GEMM with the
// machine's BLAS peak and the rest with its memory bandwidth. Run: build/bench/cpu_kernels_bench.
#include <benchmark/benchmark.h>

#include <cstdint>

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/random.h"         // Generator, randn
#include "colossal/ops/elementwise.h"     // add, gelu
#include "colossal/ops/linalg.h"          // matmul
#include "colossal/ops/nn_functional.h"   // softmax, layer_norm
#include "colossal/ops/reduction.h"       // sum

namespace colossal {
namespace {

Tensor random_f32(const Shape& shape, uint64_t seed) {
  core::Generator gen(seed);
  return core::randn(shape, {}, &gen);
}

// Kernels run OpenMP threads (and BLAS its own), so rates use wall time (UseRealTime), not the main
// thread's CPU time. The console shows them with SI prefixes: flops=30G/s is 30 GFLOP/s.
void set_rate(benchmark::State& state, const char* name, double per_iteration) {
  state.counters[name] = benchmark::Counter(static_cast<double>(state.iterations()) * per_iteration,
                                            benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

constexpr double kF32 = sizeof(float);

void BM_matmul_f32(benchmark::State& state) {
  autograd::NoGradGuard no_grad;
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  const Tensor a = random_f32({m, k}, 1), b = random_f32({k, n}, 2);
  for (auto _ : state) benchmark::DoNotOptimize(ops::matmul(a, b));
  set_rate(state, "flops", 2.0 * m * n * k);
}
BENCHMARK(BM_matmul_f32)
    ->ArgNames({"M", "K", "N"})
    ->Args({256, 256, 256})
    ->Args({512, 512, 512})
    ->Args({1024, 1024, 1024})
    ->Args({2048, 768, 3072})  // GPT-2 small MLP up-projection on 2048 tokens
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_add_f32(benchmark::State& state) {
  autograd::NoGradGuard no_grad;
  const int64_t n = state.range(0);
  const Tensor a = random_f32({n}, 1), b = random_f32({n}, 2);
  for (auto _ : state) benchmark::DoNotOptimize(ops::add(a, b));
  set_rate(state, "bytes", 3.0 * n * kF32);
}
BENCHMARK(BM_add_f32)->ArgName("n")->Arg(1 << 16)->Arg(1 << 22)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_gelu_f32(benchmark::State& state) {
  autograd::NoGradGuard no_grad;
  const int64_t n = state.range(0);
  const auto approximation = state.range(1) ? ops::GeluApproximation::tanh : ops::GeluApproximation::none;
  const Tensor a = random_f32({n}, 1);
  for (auto _ : state) benchmark::DoNotOptimize(ops::gelu(a, approximation));
  set_rate(state, "bytes", 2.0 * n * kF32);
}
BENCHMARK(BM_gelu_f32)
    ->ArgNames({"n", "tanh"})
    ->Args({1 << 22, 0})
    ->Args({1 << 22, 1})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_softmax_rows_f32(benchmark::State& state) {
  autograd::NoGradGuard no_grad;
  const int64_t rows = state.range(0), cols = state.range(1);
  const Tensor x = random_f32({rows, cols}, 1);
  for (auto _ : state) benchmark::DoNotOptimize(ops::softmax(x, -1));
  set_rate(state, "bytes", 2.0 * rows * cols * kF32);
}
BENCHMARK(BM_softmax_rows_f32)
    ->ArgNames({"rows", "cols"})
    ->Args({4096, 1024})
    ->Args({256, 50257})  // GPT-2's vocabulary: the logits of a language model
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_layer_norm_f32(benchmark::State& state) {
  autograd::NoGradGuard no_grad;
  const int64_t rows = state.range(0), cols = state.range(1);
  const Tensor x = random_f32({rows, cols}, 1), weight = random_f32({cols}, 2), bias = random_f32({cols}, 3);
  for (auto _ : state) benchmark::DoNotOptimize(ops::layer_norm(x, {cols}, weight, bias));
  set_rate(state, "bytes", (2.0 * rows * cols + 2.0 * cols) * kF32);
}
BENCHMARK(BM_layer_norm_f32)
    ->ArgNames({"rows", "cols"})
    ->Args({4096, 768})  // GPT-2 small's hidden size
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_sum_f32(benchmark::State& state) {
  autograd::NoGradGuard no_grad;
  const int64_t n = state.range(0);
  const Tensor a = random_f32({n}, 1);
  for (auto _ : state) benchmark::DoNotOptimize(ops::sum(a));
  set_rate(state, "bytes", n * kF32);
}
BENCHMARK(BM_sum_f32)->ArgName("n")->Arg(1 << 16)->Arg(1 << 22)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The generic strided loop: reading a transposed view column by column into a contiguous tensor.
void BM_transpose_copy_f32(benchmark::State& state) {
  autograd::NoGradGuard no_grad;
  const int64_t n = state.range(0);
  const Tensor a = random_f32({n, n}, 1);
  for (auto _ : state) benchmark::DoNotOptimize(a.transpose(0, 1).contiguous());
  set_rate(state, "bytes", 2.0 * n * n * kF32);
}
BENCHMARK(BM_transpose_copy_f32)->ArgName("n")->Arg(512)->Arg(2048)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
}  // namespace colossal
