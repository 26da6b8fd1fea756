// CPU softmax and log_softmax kernels, forward and backward, for f32, f64, f16 and bf16 (the last
// two computed in f32). Rows are independent, so threads split them; the max is subtracted before
// exponentiating so that large logits cannot overflow.
#include <cmath>
#include <limits>
#include <type_traits>

#include "colossal/core/parallel_for.h"  // parallel_for
#include "colossal/ops/nn_kernels.h"

namespace colossal::ops {
namespace {

/// Calls row(first_element_offset) for every softmax row of the [outer, size, inner] layout, the
/// row's elements being `inner` apart; rows are spread over threads.
template <class Row>
void for_each_row(int64_t outer, int64_t size, int64_t inner, Row&& row) {
  const int64_t rows = outer * inner;
  core::parallel_for(0, rows, std::max<int64_t>(1, core::kParallelGrain / std::max<int64_t>(size, 1)),
                     [&](int64_t begin, int64_t end) {
                       for (int64_t r = begin; r < end; ++r) row((r / inner) * size * inner + r % inner);
                     });
}

void softmax_forward_cpu(const Tensor& out, const Tensor& x, int64_t outer, int64_t size, int64_t inner, bool log) {
  core::dispatch_floating(x.dtype(), log ? "log_softmax" : "softmax", [&]<class T>() {
    using Acc = core::acc_t<T>;
    const T* in = x.data<T>();
    T* y = out.data<T>();
    for_each_row(outer, size, inner, [&](int64_t start) {
      const T* xr = in + start;
      T* yr = y + start;
      Acc max_value = -std::numeric_limits<Acc>::infinity();
      for (int64_t i = 0; i < size; ++i) max_value = std::max(max_value, static_cast<Acc>(xr[i * inner]));
      Acc sum = 0;
      if (log) {
        for (int64_t i = 0; i < size; ++i) sum += std::exp(static_cast<Acc>(xr[i * inner]) - max_value);
        // (x - max) - log(sum), not x - (max + log(sum)): the latter rounds log(sum) at max's
        // magnitude, losing digits whenever |max| is large.
        const Acc log_sum = std::log(sum);
        for (int64_t i = 0; i < size; ++i) {
          yr[i * inner] = static_cast<T>((static_cast<Acc>(xr[i * inner]) - max_value) - log_sum);
        }
        return;
      }
      // f32 and f64 keep the exponentials in the output for the normalising pass; f16 and bf16
      // recompute them rather than normalise already-rounded values.
      for (int64_t i = 0; i < size; ++i) {
        const Acc e = std::exp(static_cast<Acc>(xr[i * inner]) - max_value);
        if constexpr (std::is_same_v<T, Acc>) yr[i * inner] = e;
        sum += e;
      }
      const Acc inv = Acc(1) / sum;
      for (int64_t i = 0; i < size; ++i) {
        if constexpr (std::is_same_v<T, Acc>) {
          yr[i * inner] *= inv;
        } else {
          yr[i * inner] = static_cast<T>(std::exp(static_cast<Acc>(xr[i * inner]) - max_value) * inv);
        }
      }
    });
  });
}

void softmax_backward_cpu(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y, int64_t outer, int64_t size,
                          int64_t inner, bool log) {
  core::dispatch_floating(y.dtype(), log ? "log_softmax backward" : "softmax backward", [&]<class T>() {
    using Acc = core::acc_t<T>;
    const T* dy = grad_y.data<T>();
    const T* out = y.data<T>();
    T* dx = grad_x.data<T>();
    for_each_row(outer, size, inner, [&](int64_t start) {
      const T* dyr = dy + start;
      const T* yr = out + start;
      T* dxr = dx + start;
      Acc dot = 0;
      if (log) {  // dx = dy - softmax * sum(dy), softmax = exp(log_softmax)
        for (int64_t i = 0; i < size; ++i) dot += static_cast<Acc>(dyr[i * inner]);
        for (int64_t i = 0; i < size; ++i) {
          dxr[i * inner] =
              static_cast<T>(static_cast<Acc>(dyr[i * inner]) - std::exp(static_cast<Acc>(yr[i * inner])) * dot);
        }
      } else {  // dx = y * (dy - sum(dy * y))
        for (int64_t i = 0; i < size; ++i) dot += static_cast<Acc>(dyr[i * inner]) * static_cast<Acc>(yr[i * inner]);
        for (int64_t i = 0; i < size; ++i) {
          dxr[i * inner] = static_cast<T>(static_cast<Acc>(yr[i * inner]) * (static_cast<Acc>(dyr[i * inner]) - dot));
        }
      }
    });
  });
}

COLOSSAL_REGISTER_KERNEL(softmax_forward_stub, core::DeviceType::cpu, softmax_forward_cpu);
COLOSSAL_REGISTER_KERNEL(softmax_backward_stub, core::DeviceType::cpu, softmax_backward_cpu);

}  // namespace
}  // namespace colossal::ops
