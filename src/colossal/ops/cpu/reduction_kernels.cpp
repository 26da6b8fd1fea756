// CPU reduction kernels over [outer, reduce, inner] layouts. Partial sums are combined in a fixed
// order, so results are the same run to run for a given thread count.
#include <cmath>
#include <vector>

#include "colossal/core/parallel_for.h"
#include "colossal/ops/reduction_kernels.h"

namespace colossal::ops {
namespace {

/// f32 sums accumulate in f64: a 1e6-element f32 sum then stays exact to f32 rounding.
template <class T>
using sum_acc_t = std::conditional_t<std::is_same_v<T, float>, double, core::acc_t<T>>;

template <class T, class Out>
void sum_typed(Out* out, const T* in, int64_t outer, int64_t reduce, int64_t inner) {
  using A = sum_acc_t<T>;
  if (inner == 1) {
    if (outer == 1) {
      // One long row: per-thread partials, added in thread order.
      const int threads = omp_get_max_threads();
      std::vector<A> partial(static_cast<size_t>(threads), A(0));
      const int64_t chunk = (reduce + threads - 1) / threads;
      core::parallel_for(0, threads, 1, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
          A acc = A(0);
          const int64_t lo = t * chunk, hi = std::min(reduce, lo + chunk);
          for (int64_t r = lo; r < hi; ++r) acc += static_cast<A>(in[r]);
          partial[t] = acc;
        }
      });
      A total = A(0);
      for (A p : partial) total += p;
      out[0] = static_cast<Out>(static_cast<core::acc_t<Out>>(total));
      return;
    }
    core::parallel_for(0, outer, std::max<int64_t>(1, core::kParallelGrain / std::max<int64_t>(reduce, 1)),
                       [&](int64_t b, int64_t e) {
                         for (int64_t o = b; o < e; ++o) {
                           A acc = A(0);
                           const T* row = in + o * reduce;
                           for (int64_t r = 0; r < reduce; ++r) acc += static_cast<A>(row[r]);
                           out[o] = static_cast<Out>(static_cast<core::acc_t<Out>>(acc));
                         }
                       });
    return;
  }
  // Reduce over a middle dim: accumulate whole rows of `inner`, which vectorises.
  const int64_t work_per_outer = reduce * inner;
  const int64_t inner_chunk =
      outer == 1 ? std::max<int64_t>(64, core::kParallelGrain / std::max<int64_t>(reduce, 1)) : inner;
  const int64_t chunks_per_outer = (inner + inner_chunk - 1) / inner_chunk;
  core::parallel_for(
      0, outer * chunks_per_outer,
      std::max<int64_t>(1, core::kParallelGrain / std::max<int64_t>(work_per_outer / chunks_per_outer, 1)),
      [&](int64_t b, int64_t e) {
        std::vector<A> acc;
        for (int64_t job = b; job < e; ++job) {
          const int64_t o = job / chunks_per_outer;
          const int64_t i0 = (job % chunks_per_outer) * inner_chunk;
          const int64_t n = std::min(inner, i0 + inner_chunk) - i0;
          acc.assign(static_cast<size_t>(n), A(0));
          for (int64_t r = 0; r < reduce; ++r) {
            const T* row = in + (o * reduce + r) * inner + i0;
            for (int64_t i = 0; i < n; ++i) acc[i] += static_cast<A>(row[i]);
          }
          for (int64_t i = 0; i < n; ++i)
            out[o * inner + i0 + i] = static_cast<Out>(static_cast<core::acc_t<Out>>(acc[i]));
        }
      });
}

void sum_cpu(const Tensor& out, const Tensor& in, int64_t outer, int64_t reduce, int64_t inner) {
  core::dispatch_all(in.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<core::acc_t<T>>) {
      sum_typed<T, T>(out.data<T>(), in.data<T>(), outer, reduce, inner);
    } else {
      // Integer and bool sums count in i64.
      const Tensor wide = core::empty(in.shape(), DType::i64);
      const T* src = in.data<T>();
      int64_t* dst = wide.data<int64_t>();
      for (int64_t i = 0; i < in.numel(); ++i) dst[i] = static_cast<int64_t>(src[i]);
      sum_typed<int64_t, int64_t>(out.data<int64_t>(), dst, outer, reduce, inner);
    }
  });
}

void max_cpu(const Tensor& values, const Tensor& indices, const Tensor& in, int64_t outer, int64_t reduce,
             int64_t inner) {
  core::dispatch_arithmetic(in.dtype(), "max", [&]<class T>() {
    using A = core::acc_t<T>;
    const T* src = in.data<T>();
    T* out = values.data<T>();
    int64_t* idx = indices.data<int64_t>();
    core::parallel_for(0, outer * inner, std::max<int64_t>(1, core::kParallelGrain / reduce),
                       [&](int64_t b, int64_t e) {
                         for (int64_t job = b; job < e; ++job) {
                           const int64_t o = job / inner, i = job % inner;
                           const T* base = src + o * reduce * inner + i;
                           A best = static_cast<A>(base[0]);
                           int64_t best_at = 0;
                           for (int64_t r = 1; r < reduce; ++r) {
                             const A v = static_cast<A>(base[r * inner]);
                             if constexpr (std::is_floating_point_v<A>) {
                               if (std::isnan(best)) break;
                               if (std::isnan(v) || v > best) {
                                 best = v;
                                 best_at = r;
                               }
                             } else if (v > best) {
                               best = v;
                               best_at = r;
                             }
                           }
                           out[job] = base[best_at * inner];
                           idx[job] = best_at;
                         }
                       });
  });
}

void max_backward_cpu(const Tensor& grad_in, const Tensor& grad, const Tensor& indices, int64_t outer, int64_t reduce,
                      int64_t inner) {
  core::dispatch_floating(grad.dtype(), "max backward", [&]<class T>() {
    T* dst = grad_in.data<T>();
    const T* g = grad.data<T>();
    const int64_t* idx = indices.data<int64_t>();
    for (int64_t job = 0; job < outer * inner; ++job) {
      const int64_t o = job / inner, i = job % inner;
      dst[(o * reduce + idx[job]) * inner + i] = g[job];
    }
  });
}

COLOSSAL_REGISTER_KERNEL(sum_stub, core::DeviceType::cpu, sum_cpu);
COLOSSAL_REGISTER_KERNEL(max_stub, core::DeviceType::cpu, max_cpu);
COLOSSAL_REGISTER_KERNEL(max_backward_stub, core::DeviceType::cpu, max_backward_cpu);

}  // namespace
}  // namespace colossal::ops
