// CPU layer_norm kernels, forward and backward, for f32, f64, f16 and bf16 (the last two computed
// in f32). Rows are spread over threads; the weight and bias gradients, which sum over rows, are
// reduced through a fixed number of row blocks so the result does not depend on the thread count.
#include <cmath>
#include <type_traits>
#include <vector>

#include "colossal/core/parallel_for.h"  // parallel_for
#include "colossal/ops/nn_kernels.h"

namespace colossal::ops {
namespace {

/// Row blocks the weight and bias gradients are partially summed over: enough to keep every
/// thread busy, few enough that summing the partials stays negligible.
constexpr int64_t kRowBlocks = 64;

int64_t row_grain(int64_t cols) {
  return std::max<int64_t>(1, core::kParallelGrain / std::max<int64_t>(cols, 1));
}

void layer_norm_forward_cpu(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                            const Tensor& weight, const Tensor& bias, double eps) {
  const int64_t rows = x.size(0), cols = x.size(1);
  core::dispatch_floating(x.dtype(), "layer_norm", [&]<class T>() {
    using Acc = core::acc_t<T>;
    using Stat = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const T* in = x.data<T>();
    const T* w = weight.defined() ? weight.data<T>() : nullptr;
    const T* b = bias.defined() ? bias.data<T>() : nullptr;
    T* out = y.data<T>();
    Stat* mean_out = mean.data<Stat>();
    Stat* rstd_out = rstd.data<Stat>();
    core::parallel_for(0, rows, row_grain(cols), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* xr = in + r * cols;
        T* yr = out + r * cols;
        // Two passes (mean, then squared deviations) avoid the cancellation of E[x^2] - E[x]^2.
        Acc sum = 0;
        for (int64_t j = 0; j < cols; ++j) sum += static_cast<Acc>(xr[j]);
        const Acc mu = sum / static_cast<Acc>(cols);
        Acc sq = 0;
        for (int64_t j = 0; j < cols; ++j) {
          const Acc d = static_cast<Acc>(xr[j]) - mu;
          sq += d * d;
        }
        const Acc inv_std = Acc(1) / std::sqrt(sq / static_cast<Acc>(cols) + static_cast<Acc>(eps));
        mean_out[r] = static_cast<Stat>(mu);
        rstd_out[r] = static_cast<Stat>(inv_std);
        for (int64_t j = 0; j < cols; ++j) {
          Acc v = (static_cast<Acc>(xr[j]) - mu) * inv_std;
          if (w) v *= static_cast<Acc>(w[j]);
          if (b) v += static_cast<Acc>(b[j]);
          yr[j] = static_cast<T>(v);
        }
      }
    });
  });
}

void layer_norm_backward_cpu(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                             const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                             const Tensor& weight, bool accumulate_x) {
  const int64_t rows = x.size(0), cols = x.size(1);
  core::dispatch_floating(x.dtype(), "layer_norm backward", [&]<class T>() {
    using Acc = core::acc_t<T>;
    using Stat = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const T* in = x.data<T>();
    const T* dy = grad_y.data<T>();
    const T* w = weight.defined() ? weight.data<T>() : nullptr;
    const Stat* mean_in = mean.data<Stat>();
    const Stat* rstd_in = rstd.data<Stat>();

    if (grad_x.defined()) {
      // With g = dy * weight and xhat = (x - mean) * rstd:
      // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
      T* dx = grad_x.data<T>();
      core::parallel_for(0, rows, row_grain(cols), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const T* xr = in + r * cols;
          const T* dyr = dy + r * cols;
          const Acc mu = static_cast<Acc>(mean_in[r]), inv_std = static_cast<Acc>(rstd_in[r]);
          Acc sum_g = 0, sum_g_xhat = 0;
          for (int64_t j = 0; j < cols; ++j) {
            const Acc g = w ? static_cast<Acc>(dyr[j]) * static_cast<Acc>(w[j]) : static_cast<Acc>(dyr[j]);
            sum_g += g;
            sum_g_xhat += g * (static_cast<Acc>(xr[j]) - mu) * inv_std;
          }
          const Acc mean_g = sum_g / static_cast<Acc>(cols), mean_g_xhat = sum_g_xhat / static_cast<Acc>(cols);
          T* dxr = dx + r * cols;
          for (int64_t j = 0; j < cols; ++j) {
            const Acc g = w ? static_cast<Acc>(dyr[j]) * static_cast<Acc>(w[j]) : static_cast<Acc>(dyr[j]);
            const Acc xhat = (static_cast<Acc>(xr[j]) - mu) * inv_std;
            const Acc value = inv_std * (g - mean_g - xhat * mean_g_xhat);
            dxr[j] = accumulate_x ? static_cast<T>(static_cast<Acc>(dxr[j]) + static_cast<Acc>(static_cast<T>(value)))
                                  : static_cast<T>(value);
          }
        }
      });
    }

    if (!grad_weight.defined() && !grad_bias.defined()) return;
    // dweight = sum over rows of dy * xhat, dbias = sum over rows of dy: partial sums per row
    // block, then the blocks in order.
    const int64_t blocks = std::min(rows, kRowBlocks);
    const int64_t rows_per_block = blocks == 0 ? 0 : (rows + blocks - 1) / blocks;
    std::vector<Acc> partial_w(grad_weight.defined() ? blocks * cols : 0, Acc(0));
    std::vector<Acc> partial_b(grad_bias.defined() ? blocks * cols : 0, Acc(0));
    core::parallel_for(0, blocks, std::max<int64_t>(1, row_grain(cols) / std::max<int64_t>(rows_per_block, 1)),
                       [&](int64_t begin, int64_t end) {
                         for (int64_t block = begin; block < end; ++block) {
                           Acc* pw = partial_w.empty() ? nullptr : partial_w.data() + block * cols;
                           Acc* pb = partial_b.empty() ? nullptr : partial_b.data() + block * cols;
                           const int64_t row_end = std::min(rows, (block + 1) * rows_per_block);
                           for (int64_t r = block * rows_per_block; r < row_end; ++r) {
                             const T* xr = in + r * cols;
                             const T* dyr = dy + r * cols;
                             const Acc mu = static_cast<Acc>(mean_in[r]), inv_std = static_cast<Acc>(rstd_in[r]);
                             for (int64_t j = 0; j < cols; ++j) {
                               const Acc d = static_cast<Acc>(dyr[j]);
                               if (pw) pw[j] += d * (static_cast<Acc>(xr[j]) - mu) * inv_std;
                               if (pb) pb[j] += d;
                             }
                           }
                         }
                       });
    auto finish = [&](const Tensor& grad, const std::vector<Acc>& partial) {
      if (!grad.defined()) return;
      T* g = grad.data<T>();
      for (int64_t j = 0; j < cols; ++j) {
        Acc total = 0;
        for (int64_t block = 0; block < blocks; ++block) total += partial[block * cols + j];
        g[j] = static_cast<T>(total);
      }
    };
    finish(grad_weight, partial_w);
    finish(grad_bias, partial_b);
  });
}

COLOSSAL_REGISTER_KERNEL(layer_norm_forward_stub, core::DeviceType::cpu, layer_norm_forward_cpu);
COLOSSAL_REGISTER_KERNEL(layer_norm_backward_stub, core::DeviceType::cpu, layer_norm_backward_cpu);

}  // namespace
}  // namespace colossal::ops
