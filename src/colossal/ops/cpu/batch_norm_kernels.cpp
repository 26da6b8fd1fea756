// CPU batch_norm2d forward and fused backward. Each channel is one task (its N * H * W values);
// per-channel sums accumulate in f64 so that large batches of f32/f16 values keep their precision.
#include <algorithm>
#include <cmath>
#include <vector>

#include "colossal/core/parallel_for.h"  // parallel_for
#include "colossal/ops/conv_kernels.h"   // batch_norm stubs

namespace colossal::ops {
namespace {

/// A [C] tensor of any floating dtype as doubles (running statistics may differ from x's dtype).
std::vector<double> to_doubles(const Tensor& t) {
  return t.to_vector<double>();
}

void store_doubles(const Tensor& t, const std::vector<double>& values) {
  core::dispatch_floating(t.dtype(), "batch_norm2d running statistics", [&]<class R>() {
    R* dst = t.data<R>();
    for (size_t i = 0; i < values.size(); ++i) dst[i] = static_cast<R>(static_cast<core::acc_t<R>>(values[i]));
  });
}

/// The dtype of save_mean / save_invstd for input type T.
template <class T>
using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

struct ChannelLayout {
  explicit ChannelLayout(const Tensor& x)
      : batch(x.size(0)), channels(x.size(1)), area(x.size(2) * x.size(3)), count(batch * area) {}
  int64_t batch, channels, area, count;
  /// Calls f(first element of the plane) for each of channel c's N planes of `area` elements.
  template <class T, class F>
  void for_each_plane(T* base, int64_t c, F&& f) const {
    for (int64_t n = 0; n < batch; ++n) f(base + (n * channels + c) * area);
  }
};

void batch_norm_forward_cpu(const Tensor& y, const Tensor& save_mean, const Tensor& save_invstd, const Tensor& x,
                            const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                            const Tensor& bias, bool training, double momentum, double eps) {
  const ChannelLayout layout(x);
  const bool has_running = running_mean.defined();
  std::vector<double> run_mean = has_running ? to_doubles(running_mean) : std::vector<double>();
  std::vector<double> run_var = has_running ? to_doubles(running_var) : std::vector<double>();
  core::dispatch_floating(x.dtype(), "batch_norm2d", [&]<class T>() {
    using A = core::acc_t<T>;
    using S = stat_t<T>;
    const T* in = x.data<T>();
    T* out = y.data<T>();
    const T* w = weight.defined() ? weight.data<T>() : nullptr;
    const T* b = bias.defined() ? bias.data<T>() : nullptr;
    S* mean_out = save_mean.data<S>();
    S* invstd_out = save_invstd.data<S>();
    const int64_t grain = std::max<int64_t>(1, core::kParallelGrain / std::max<int64_t>(layout.count, 1));
    core::parallel_for(0, layout.channels, grain, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        double mean, invstd;
        if (training) {
          // Two passes (mean, then squared deviations): E[x^2] - E[x]^2 cancels badly.
          double total = 0.0;
          layout.for_each_plane(in, c, [&](const T* p) {
            for (int64_t i = 0; i < layout.area; ++i) total += static_cast<double>(static_cast<A>(p[i]));
          });
          mean = total / static_cast<double>(layout.count);
          double squares = 0.0;
          layout.for_each_plane(in, c, [&](const T* p) {
            for (int64_t i = 0; i < layout.area; ++i) {
              const double dev = static_cast<double>(static_cast<A>(p[i])) - mean;
              squares += dev * dev;
            }
          });
          const double biased_var = squares / static_cast<double>(layout.count);
          invstd = 1.0 / std::sqrt(biased_var + eps);
          if (has_running) {
            const double unbiased_var = squares / static_cast<double>(layout.count - 1);
            run_mean[c] = (1.0 - momentum) * run_mean[c] + momentum * mean;
            run_var[c] = (1.0 - momentum) * run_var[c] + momentum * unbiased_var;
          }
        } else {
          mean = run_mean[c];
          invstd = 1.0 / std::sqrt(run_var[c] + eps);
        }
        mean_out[c] = static_cast<S>(mean);
        invstd_out[c] = static_cast<S>(invstd);
        // y = x * scale + shift folds the normalisation and the affine map into one multiply-add.
        const double gamma = w != nullptr ? static_cast<double>(static_cast<A>(w[c])) : 1.0;
        const double beta = b != nullptr ? static_cast<double>(static_cast<A>(b[c])) : 0.0;
        const A scale = static_cast<A>(gamma * invstd);
        const A shift = static_cast<A>(beta - mean * gamma * invstd);
        for (int64_t n = 0; n < layout.batch; ++n) {
          const int64_t offset = (n * layout.channels + c) * layout.area;
          for (int64_t i = 0; i < layout.area; ++i)
            out[offset + i] = static_cast<T>(static_cast<A>(in[offset + i]) * scale + shift);
        }
      }
    });
  });
  if (training && has_running) {
    store_doubles(running_mean, run_mean);
    store_doubles(running_var, run_var);
  }
}

void batch_norm_backward_cpu(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                             const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                             const Tensor& save_invstd, bool training) {
  const ChannelLayout layout(x);
  core::dispatch_floating(x.dtype(), "batch_norm2d_backward", [&]<class T>() {
    using A = core::acc_t<T>;
    using S = stat_t<T>;
    const T* in = x.data<T>();
    const T* dy = grad_y.data<T>();
    const T* w = weight.defined() ? weight.data<T>() : nullptr;
    const S* mean_in = save_mean.data<S>();
    const S* invstd_in = save_invstd.data<S>();
    T* dx = grad_x.defined() ? grad_x.data<T>() : nullptr;
    T* dw = grad_weight.defined() ? grad_weight.data<T>() : nullptr;
    T* db = grad_bias.defined() ? grad_bias.data<T>() : nullptr;
    const int64_t grain = std::max<int64_t>(1, core::kParallelGrain / std::max<int64_t>(layout.count, 1));
    core::parallel_for(0, layout.channels, grain, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const double mean = static_cast<double>(mean_in[c]);
        const double invstd = static_cast<double>(invstd_in[c]);
        // sum(dy) and sum(dy * xhat), with xhat = (x - mean) * invstd, the normalised input.
        double sum_dy = 0.0, sum_dy_xhat = 0.0;
        for (int64_t n = 0; n < layout.batch; ++n) {
          const int64_t offset = (n * layout.channels + c) * layout.area;
          for (int64_t i = 0; i < layout.area; ++i) {
            const double g = static_cast<double>(static_cast<A>(dy[offset + i]));
            sum_dy += g;
            sum_dy_xhat += g * (static_cast<double>(static_cast<A>(in[offset + i])) - mean) * invstd;
          }
        }
        if (db != nullptr) db[c] = static_cast<T>(static_cast<A>(sum_dy));
        if (dw != nullptr) dw[c] = static_cast<T>(static_cast<A>(sum_dy_xhat));
        if (dx == nullptr) continue;
        const double gamma = w != nullptr ? static_cast<double>(static_cast<A>(w[c])) : 1.0;
        const A scale = static_cast<A>(gamma * invstd);
        // Training: the batch statistics depend on x, which subtracts the gradient's mean and its
        // projection on xhat: dx = gamma * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)).
        // Evaluation: the statistics are constants and dx = gamma * invstd * dy.
        const A mean_dy = training ? static_cast<A>(sum_dy / static_cast<double>(layout.count)) : A(0);
        const A mean_dy_xhat = training ? static_cast<A>(sum_dy_xhat / static_cast<double>(layout.count)) : A(0);
        const A mean_a = static_cast<A>(mean);
        const A invstd_a = static_cast<A>(invstd);
        for (int64_t n = 0; n < layout.batch; ++n) {
          const int64_t offset = (n * layout.channels + c) * layout.area;
          for (int64_t i = 0; i < layout.area; ++i) {
            const A xhat = (static_cast<A>(in[offset + i]) - mean_a) * invstd_a;
            dx[offset + i] = static_cast<T>(scale * (static_cast<A>(dy[offset + i]) - mean_dy - xhat * mean_dy_xhat));
          }
        }
      }
    });
  });
}

}  // namespace

COLOSSAL_REGISTER_KERNEL(batch_norm_forward_stub, core::DeviceType::cpu, batch_norm_forward_cpu);
COLOSSAL_REGISTER_KERNEL(batch_norm_backward_stub, core::DeviceType::cpu, batch_norm_backward_cpu);

}  // namespace colossal::ops
