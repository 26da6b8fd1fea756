// CPU max, average and adaptive average pooling, forward and backward. Every (image, channel) plane
// is independent, so planes are the unit of parallel work; backward kernels gather into one plane
// per task and never race.
#include <algorithm>
#include <cmath>
#include <vector>

#include "colossal/core/parallel_for.h"  // parallel_for
#include "colossal/ops/conv_kernels.h"   // pooling stubs

namespace colossal::ops {
namespace {

/// The spatial sizes shared by a forward input x [N, C, H, W] and its output [N, C, oH, oW].
struct Planes {
  Planes(const Tensor& in, const Tensor& out)
      : count(in.size(0) * in.size(1)),
        height(in.size(2)),
        width(in.size(3)),
        out_height(out.size(2)),
        out_width(out.size(3)) {}
  int64_t count, height, width, out_height, out_width;
  int64_t area() const { return height * width; }
  int64_t out_area() const { return out_height * out_width; }
  /// Planes per parallel task so that a task touches about kParallelGrain elements.
  int64_t grain() const {
    return std::max<int64_t>(1, core::kParallelGrain / std::max<int64_t>(area() + out_area(), 1));
  }
};

/// One (non-adaptive) window along one axis: [start, end) inside the input and the divisor
/// contribution of the window when padding is counted.
struct Window {
  int64_t start, end, padded_size;
};

Window window(int64_t o, int64_t stride, int64_t pad, int64_t kernel, int64_t size) {
  const int64_t start = o * stride - pad;
  const int64_t padded_end = std::min(start + kernel, size + pad);
  return {std::max<int64_t>(start, 0), std::min(padded_end, size), padded_end - start};
}

/// PyTorch's adaptive windows: [floor(i * in / out), ceil((i + 1) * in / out)).
Window adaptive_window(int64_t i, int64_t out, int64_t in) {
  const int64_t start = (i * in) / out;
  const int64_t end = ((i + 1) * in + out - 1) / out;
  return {start, end, end - start};
}

void max_pool2d_forward_cpu(const Tensor& out, const Tensor& indices, const Tensor& x, const Pool2dGeometry& g) {
  const Planes p(x, out);
  core::dispatch_floating(x.dtype(), "max_pool2d", [&]<class T>() {
    using A = core::acc_t<T>;
    const T* in = x.data<T>();
    T* dst = out.data<T>();
    int64_t* idx = indices.data<int64_t>();
    core::parallel_for(0, p.count, p.grain(), [&](int64_t begin, int64_t end) {
      for (int64_t plane = begin; plane < end; ++plane) {
        const T* src = in + plane * p.area();
        for (int64_t oh = 0; oh < p.out_height; ++oh) {
          const Window wh = window(oh, g.stride_h, g.pad_h, g.kernel_h, p.height);
          for (int64_t ow = 0; ow < p.out_width; ++ow) {
            const Window ww = window(ow, g.stride_w, g.pad_w, g.kernel_w, p.width);
            // padding <= kernel / 2 guarantees every window holds at least one real element.
            int64_t best_index = wh.start * p.width + ww.start;
            A best = static_cast<A>(src[best_index]);
            for (int64_t h = wh.start; h < wh.end; ++h) {
              for (int64_t w = ww.start; w < ww.end; ++w) {
                const A v = static_cast<A>(src[h * p.width + w]);
                if (v > best || std::isnan(v)) {
                  best = v;
                  best_index = h * p.width + w;
                }
              }
            }
            const int64_t o = plane * p.out_area() + oh * p.out_width + ow;
            dst[o] = static_cast<T>(best);
            idx[o] = best_index;
          }
        }
      }
    });
  });
}

/// Scatters by `indices` one plane per task, so it needs no geometry.
void max_pool2d_backward_cpu(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices,
                             const Pool2dGeometry&) {
  const Planes p(grad_x, grad_out);
  core::dispatch_floating(grad_x.dtype(), "max_pool2d_backward", [&]<class T>() {
    using A = core::acc_t<T>;
    const T* dy = grad_out.data<T>();
    const int64_t* idx = indices.data<int64_t>();
    T* dx = grad_x.data<T>();
    core::parallel_for(0, p.count, p.grain(), [&](int64_t begin, int64_t end) {
      // Overlapping windows may share a maximum: sum in A, round to T once.
      std::vector<A> acc(static_cast<size_t>(p.area()));
      for (int64_t plane = begin; plane < end; ++plane) {
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t o = plane * p.out_area(); o < (plane + 1) * p.out_area(); ++o)
          acc[idx[o]] += static_cast<A>(dy[o]);
        T* plane_dx = dx + plane * p.area();
        for (int64_t i = 0; i < p.area(); ++i) plane_dx[i] = static_cast<T>(acc[i]);
      }
    });
  });
}

/// The number an average over window (wh, ww) divides by.
int64_t divisor(const Window& wh, const Window& ww, bool count_include_pad) {
  return count_include_pad ? wh.padded_size * ww.padded_size : (wh.end - wh.start) * (ww.end - ww.start);
}

/// Average pooling over the windows `windows(oh, ow)` returns as {wh, ww, divisor}: the forward of
/// avg_pool2d and adaptive_avg_pool2d, which differ only there.
template <class Windows>
void average_pool_forward(const Tensor& out, const Tensor& x, const char* name, const Windows& windows) {
  const Planes p(x, out);
  core::dispatch_floating(x.dtype(), name, [&]<class T>() {
    using A = core::acc_t<T>;
    const T* in = x.data<T>();
    T* dst = out.data<T>();
    core::parallel_for(0, p.count, p.grain(), [&](int64_t begin, int64_t end) {
      for (int64_t plane = begin; plane < end; ++plane) {
        const T* src = in + plane * p.area();
        for (int64_t oh = 0; oh < p.out_height; ++oh) {
          for (int64_t ow = 0; ow < p.out_width; ++ow) {
            const auto [wh, ww, count] = windows(p, oh, ow);
            A total = A(0);
            for (int64_t h = wh.start; h < wh.end; ++h) {
              for (int64_t w = ww.start; w < ww.end; ++w) total += static_cast<A>(src[h * p.width + w]);
            }
            dst[plane * p.out_area() + oh * p.out_width + ow] = static_cast<T>(total / static_cast<A>(count));
          }
        }
      }
    });
  });
}

/// The adjoint of average_pool_forward: each output's gradient, divided by its window's divisor,
/// added to the window's inputs (one plane per task, summed in A and rounded once).
template <class Windows>
void average_pool_backward(const Tensor& grad_x, const Tensor& grad_out, const char* name, const Windows& windows) {
  const Planes p(grad_x, grad_out);
  core::dispatch_floating(grad_x.dtype(), name, [&]<class T>() {
    using A = core::acc_t<T>;
    const T* dy = grad_out.data<T>();
    T* dx = grad_x.data<T>();
    core::parallel_for(0, p.count, p.grain(), [&](int64_t begin, int64_t end) {
      std::vector<A> acc(static_cast<size_t>(p.area()));
      for (int64_t plane = begin; plane < end; ++plane) {
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t oh = 0; oh < p.out_height; ++oh) {
          for (int64_t ow = 0; ow < p.out_width; ++ow) {
            const auto [wh, ww, count] = windows(p, oh, ow);
            const A share = static_cast<A>(dy[plane * p.out_area() + oh * p.out_width + ow]) / static_cast<A>(count);
            for (int64_t h = wh.start; h < wh.end; ++h) {
              for (int64_t w = ww.start; w < ww.end; ++w) acc[h * p.width + w] += share;
            }
          }
        }
        T* plane_dx = dx + plane * p.area();
        for (int64_t i = 0; i < p.area(); ++i) plane_dx[i] = static_cast<T>(acc[i]);
      }
    });
  });
}

/// An output's window along each axis and the number its average divides by.
struct AverageWindow {
  Window wh, ww;
  int64_t divisor;
};

/// avg_pool2d's windows: strided, padded, divided by the padded or the real size.
auto fixed_windows(const Pool2dGeometry& g) {
  return [g](const Planes& p, int64_t oh, int64_t ow) {
    const Window wh = window(oh, g.stride_h, g.pad_h, g.kernel_h, p.height);
    const Window ww = window(ow, g.stride_w, g.pad_w, g.kernel_w, p.width);
    return AverageWindow{wh, ww, divisor(wh, ww, g.count_include_pad)};
  };
}

/// adaptive_avg_pool2d's windows, divided by their size.
AverageWindow adaptive_windows(const Planes& p, int64_t oh, int64_t ow) {
  const Window wh = adaptive_window(oh, p.out_height, p.height);
  const Window ww = adaptive_window(ow, p.out_width, p.width);
  return {wh, ww, wh.padded_size * ww.padded_size};
}

void avg_pool2d_forward_cpu(const Tensor& out, const Tensor& x, const Pool2dGeometry& g) {
  average_pool_forward(out, x, "avg_pool2d", fixed_windows(g));
}

void avg_pool2d_backward_cpu(const Tensor& grad_x, const Tensor& grad_out, const Pool2dGeometry& g) {
  average_pool_backward(grad_x, grad_out, "avg_pool2d_backward", fixed_windows(g));
}

void adaptive_avg_pool2d_forward_cpu(const Tensor& out, const Tensor& x) {
  average_pool_forward(out, x, "adaptive_avg_pool2d", adaptive_windows);
}

void adaptive_avg_pool2d_backward_cpu(const Tensor& grad_x, const Tensor& grad_out) {
  average_pool_backward(grad_x, grad_out, "adaptive_avg_pool2d_backward", adaptive_windows);
}

}  // namespace

COLOSSAL_REGISTER_KERNEL(max_pool2d_forward_stub, core::DeviceType::cpu, max_pool2d_forward_cpu);
COLOSSAL_REGISTER_KERNEL(max_pool2d_backward_stub, core::DeviceType::cpu, max_pool2d_backward_cpu);
COLOSSAL_REGISTER_KERNEL(avg_pool2d_forward_stub, core::DeviceType::cpu, avg_pool2d_forward_cpu);
COLOSSAL_REGISTER_KERNEL(avg_pool2d_backward_stub, core::DeviceType::cpu, avg_pool2d_backward_cpu);
COLOSSAL_REGISTER_KERNEL(adaptive_avg_pool2d_forward_stub, core::DeviceType::cpu, adaptive_avg_pool2d_forward_cpu);
COLOSSAL_REGISTER_KERNEL(adaptive_avg_pool2d_backward_stub, core::DeviceType::cpu, adaptive_avg_pool2d_backward_cpu);

}  // namespace colossal::ops
