// The host optimizer step of ZeRO's offload (optim/host_optimizer.h) in bytes of state touched per
// second, beside the machine's memory bandwidth (a multi-threaded triad over the same sizes) and the
// reference step (Adam's per-op loop, optim/adam.cpp) on the CPU. The step is memory-bound: AdamW
// reads the f32 gradient, parameter and both moments and writes the three back and the bf16 parameter
// for the copy to the GPU, 30 bytes an element; LAMB reads and writes them in two passes (the second
// re-reads parameter and moments), 42 bytes. "bytes_per_second" is that count over the time, to be
// read against Triad's (12 bytes an element, 16 with the write-allocate a plain store costs).
//   build/bench/host_optimizer_bench --benchmark_counters_tabular=true
// OMP_NUM_THREADS sets the threads (default: every core).
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include "colossal/core/parallel_for.h"
#include "colossal/core/random.h"
#include "colossal/optim/adam.h"
#include "colossal/optim/host_optimizer.h"
#include "colossal/optim/lamb.h"

namespace colossal {
namespace {

void Triad(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  for (auto _ : state) {
    core::parallel_for(0, n, core::kParallelGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) a[i] = b[i] + 0.5f * c[i];
    });
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 12);
}

struct Problem {
  Tensor param, grad, out;
  std::unique_ptr<optim::Optimizer> optimizer;
};

Problem make_problem(int64_t n, bool lamb) {
  core::Generator gen(1);
  Problem p;
  p.param = core::randn({n}, {}, &gen);
  p.grad = core::randn({n}, {}, &gen);
  p.out = core::empty({n}, {DType::bf16});
  if (lamb) {
    p.optimizer = std::make_unique<optim::Lamb>(std::vector<Tensor>{p.param}, optim::LambOptions{.weight_decay = 0.01});
  } else {
    p.optimizer = std::make_unique<optim::AdamW>(std::vector<Tensor>{p.param}, optim::adamw_defaults());
  }
  return p;
}

void HostAdamW(benchmark::State& state) {
  const int64_t n = state.range(0);
  Problem p = make_problem(n, /*lamb=*/false);
  const std::vector<optim::HostStepItem> items{{0, 0, p.grad, p.out}};
  for (auto _ : state) optim::host_step(*p.optimizer, items, 0.5);
  state.SetBytesProcessed(state.iterations() * n * 30);
}

void HostLamb(benchmark::State& state) {
  const int64_t n = state.range(0);
  Problem p = make_problem(n, /*lamb=*/true);
  const std::vector<optim::HostStepItem> items{{0, 0, p.grad, p.out}};
  for (auto _ : state) optim::host_step(*p.optimizer, items, 0.5);
  state.SetBytesProcessed(state.iterations() * n * 42);
}

void ReferenceAdamW(benchmark::State& state) {
  // optimizer.step() on the CPU: the per-op reference loop, without the bf16 copy (28 bytes counted).
  const int64_t n = state.range(0);
  Problem p = make_problem(n, /*lamb=*/false);
  p.param.set_grad(p.grad);
  for (auto _ : state) p.optimizer->step();
  state.SetBytesProcessed(state.iterations() * n * 28);
}

// 4M and 64M elements: 112 MiB and 1.8 GiB of state, both far beyond the caches.
BENCHMARK(Triad)->Arg(1 << 22)->Arg(1 << 26)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(HostAdamW)->Arg(1 << 22)->Arg(1 << 26)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(HostLamb)->Arg(1 << 22)->Arg(1 << 26)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(ReferenceAdamW)->Arg(1 << 22)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace colossal
