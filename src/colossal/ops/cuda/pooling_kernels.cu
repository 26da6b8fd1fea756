// CUDA max, average and adaptive average pooling over NCHW planes (max pooling also over NHWC
// images), forward and backward: our own
// kernels, with the CPU kernels' exact semantics (cuDNN's max pooling returns no argmax, and its
// tie and NaN rules are not ours). Forward: one thread per output reading its window. Backward:
// one thread per input element gathering from the windows that contain it, in the order the CPU
// kernel scatters (output rows, then columns), so there are no atomics and the sums are
// deterministic and rounded as on the CPU. All are bandwidth-bound: each input element is read
// about (kernel / stride)^2 times, mostly from cache.
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "colossal/core/cuda/launch.cuh"  // check_on_device, grid_for, stream_of
#include "colossal/ops/conv_kernels.h"    // pooling stubs, Pool2dGeometry

namespace colossal::ops {
namespace {

using core::acc_t;
using core::cuda_detail::check_on_device;
using core::cuda_detail::grid_for;
using core::cuda_detail::kThreads;
using core::cuda_detail::store_as;
using core::cuda_detail::stream_of;

/// Sizes of the input planes [N * C, H, W] and output planes [N * C, oH, oW]. Index is int32_t
/// when every element index fits, so the per-element divisions are 32-bit.
template <class Index>
struct PlaneSizes {
  Index planes, height, width, out_height, out_width;
};

template <class Index>
PlaneSizes<Index> plane_sizes(const Tensor& in, const Tensor& out) {
  return {static_cast<Index>(in.size(0) * in.size(1)), static_cast<Index>(in.size(2)), static_cast<Index>(in.size(3)),
          static_cast<Index>(out.size(2)), static_cast<Index>(out.size(3))};
}

/// Calls f.template operator()<Index>() with Index = int32_t when both tensors' element counts
/// (and the products adaptive windows form, oH * H and oW * W) stay below 2^30, int64_t otherwise.
/// 2^30 leaves room for a grid-stride step (at most 2^28) on top of any index.
template <class F>
void dispatch_index_width(const Tensor& in, const Tensor& out, F&& f) {
  constexpr int64_t kMax32 = int64_t{1} << 30;
  const bool fits = in.numel() < kMax32 && out.numel() < kMax32 && (out.size(2) + 1) * in.size(2) < kMax32 &&
                    (out.size(3) + 1) * in.size(3) < kMax32;
  if (fits) {
    f.template operator()<int32_t>();
  } else {
    f.template operator()<int64_t>();
  }
}

/// One window along one axis: [start, end) inside the input, and the size it has when padding
/// is counted (the CPU's Window).
template <class Index>
struct Window {
  Index start, end, padded_size;
};

template <class Index>
__device__ __forceinline__ Window<Index> window(Index o, Index stride, Index pad, Index kernel, Index size) {
  const Index start = o * stride - pad;
  const Index padded_end = min(start + kernel, size + pad);
  return {max(start, Index(0)), min(padded_end, size), padded_end - start};
}

/// PyTorch's adaptive window i of `out` over `in`: [floor(i * in / out), ceil((i + 1) * in / out)).
template <class Index>
__device__ __forceinline__ Window<Index> adaptive_window(Index i, Index out, Index in) {
  const Index start = (i * in) / out;
  const Index end = ((i + 1) * in + out - 1) / out;
  return {start, end, end - start};
}

/// The outputs o in [first, last] along one axis whose (non-adaptive) window contains input
/// position p: o * stride - pad <= p < o * stride - pad + kernel.
template <class Index>
__device__ __forceinline__ void covering_outputs(Index p, Index stride, Index pad, Index kernel, Index out_size,
                                                 Index& first, Index& last) {
  const Index shifted = p + pad;  // >= 0
  first = shifted < kernel ? Index(0) : (shifted - kernel) / stride + 1;
  last = min(shifted / stride, out_size - 1);
}

/// The adaptive outputs whose windows contain input position p: end(i) > p from i = floor(p *
/// out / in), start(i) <= p up to i = ceil((p + 1) * out / in) - 1.
template <class Index>
__device__ __forceinline__ void covering_adaptive_outputs(Index p, Index out_size, Index in_size, Index& first,
                                                          Index& last) {
  first = (p * out_size) / in_size;
  last = min(((p + 1) * out_size + in_size - 1) / in_size - 1, out_size - 1);
}

template <class Index>
struct Geometry {
  Index kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w;
  bool count_include_pad;
};

template <class Index>
Geometry<Index> device_geometry(const Pool2dGeometry& g) {
  return {static_cast<Index>(g.kernel_h),
          static_cast<Index>(g.kernel_w),
          static_cast<Index>(g.stride_h),
          static_cast<Index>(g.stride_w),
          static_cast<Index>(g.pad_h),
          static_cast<Index>(g.pad_w),
          g.count_include_pad};
}

// ---- max_pool2d

template <class T, class Index>
__global__ void max_pool_forward_kernel(T* out, int64_t* indices, const T* x, PlaneSizes<Index> p, Geometry<Index> g) {
  using A = acc_t<T>;
  const Index total = p.planes * p.out_height * p.out_width;
  for (Index o = blockIdx.x * Index(blockDim.x) + threadIdx.x; o < total; o += Index(gridDim.x) * blockDim.x) {
    const Index ow = o % p.out_width;
    const Index oh = (o / p.out_width) % p.out_height;
    const Index plane = o / (p.out_width * p.out_height);
    const T* src = x + int64_t{plane} * p.height * p.width;
    const Window<Index> wh = window(oh, g.stride_h, g.pad_h, g.kernel_h, p.height);
    const Window<Index> ww = window(ow, g.stride_w, g.pad_w, g.kernel_w, p.width);
    // padding <= kernel / 2 guarantees every window holds at least one real element. A NaN
    // replaces the best each time one is met, as on the CPU.
    Index best_index = wh.start * p.width + ww.start;
    A best = static_cast<A>(src[best_index]);
    for (Index h = wh.start; h < wh.end; ++h) {
      for (Index w = ww.start; w < ww.end; ++w) {
        const A v = static_cast<A>(src[h * p.width + w]);
        if (v > best || v != v) {
          best = v;
          best_index = h * p.width + w;
        }
      }
    }
    out[o] = store_as<T>(best);
    indices[o] = best_index;
  }
}

void max_pool2d_forward_cuda(const Tensor& out, const Tensor& indices, const Tensor& x,
                             const Pool2dGeometry& geometry) {
  check_on_device(out, x.device(), "max_pool2d", "out");
  check_on_device(indices, x.device(), "max_pool2d", "indices");
  core::cuda::DeviceGuard guard(x.device());
  core::dispatch_floating(x.dtype(), "max_pool2d", [&]<class T>() {
    dispatch_index_width(x, out, [&]<class Index>() {
      max_pool_forward_kernel<T, Index><<<grid_for(out.numel()), kThreads, 0, stream_of(x)>>>(
          out.data<T>(), indices.data<int64_t>(), x.data<T>(), plane_sizes<Index>(x, out),
          device_geometry<Index>(geometry));
      COLOSSAL_CUDA_CHECK_LAUNCH();
    });
  });
}

template <class T, class Index>
__global__ void max_pool_backward_kernel(T* grad_x, const T* grad_out, const int64_t* indices, PlaneSizes<Index> p,
                                         Geometry<Index> g) {
  using A = acc_t<T>;
  const Index total = p.planes * p.height * p.width;
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < total; i += Index(gridDim.x) * blockDim.x) {
    const Index w = i % p.width;
    const Index h = (i / p.width) % p.height;
    const Index plane = i / (p.width * p.height);
    const int64_t position = h * p.width + w;
    Index oh_first, oh_last, ow_first, ow_last;
    covering_outputs(h, g.stride_h, g.pad_h, g.kernel_h, p.out_height, oh_first, oh_last);
    covering_outputs(w, g.stride_w, g.pad_w, g.kernel_w, p.out_width, ow_first, ow_last);
    const int64_t base = int64_t{plane} * p.out_height * p.out_width;
    A total_grad = A(0);
    for (Index oh = oh_first; oh <= oh_last; ++oh) {
      for (Index ow = ow_first; ow <= ow_last; ++ow) {
        const int64_t o = base + oh * p.out_width + ow;
        if (indices[o] == position) total_grad += static_cast<A>(grad_out[o]);
      }
    }
    grad_x[i] = store_as<T>(total_grad);
  }
}

void max_pool2d_backward_cuda(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices,
                              const Pool2dGeometry& geometry) {
  check_on_device(grad_out, grad_x.device(), "max_pool2d_backward", "grad_out");
  check_on_device(indices, grad_x.device(), "max_pool2d_backward", "indices");
  core::cuda::DeviceGuard guard(grad_x.device());
  core::dispatch_floating(grad_x.dtype(), "max_pool2d_backward", [&]<class T>() {
    dispatch_index_width(grad_x, grad_out, [&]<class Index>() {
      max_pool_backward_kernel<T, Index><<<grid_for(grad_x.numel()), kThreads, 0, stream_of(grad_x)>>>(
          grad_x.data<T>(), grad_out.data<T>(), indices.data<int64_t>(), plane_sizes<Index>(grad_x, grad_out),
          device_geometry<Index>(geometry));
      COLOSSAL_CUDA_CHECK_LAUNCH();
    });
  });
}

// ---- max_pool2d, nhwc
// One thread per output (forward) or input (backward) pixel and group of channels: 16 bytes of
// channels where C allows, one channel otherwise, so the window arithmetic is done once per group
// and every load is a whole vector. The argmax is kept as a byte per output, the maximum's offset
// dh * kW + dw inside its (unclipped) window, an eighth of an i64 position's traffic; the backward
// gathers from the windows covering each input in the CPU's scatter order. Ties and NaN as above.

/// [N, H, W, groups of kVec channels] input and [N, oH, oW, groups] output sizes.
template <class Index>
struct NhwcSizes {
  Index batch, height, width, groups, out_height, out_width;
};

template <class Index>
NhwcSizes<Index> nhwc_sizes(const Tensor& in, const Tensor& out, int vec) {
  return {static_cast<Index>(in.size(0)),       static_cast<Index>(in.size(1)),  static_cast<Index>(in.size(2)),
          static_cast<Index>(in.size(3) / vec), static_cast<Index>(out.size(1)), static_cast<Index>(out.size(2))};
}

/// As dispatch_index_width, for the non-adaptive nhwc kernels (indices are element counts only).
template <class F>
void dispatch_nhwc_index_width(const Tensor& in, const Tensor& out, F&& f) {
  constexpr int64_t kMax32 = int64_t{1} << 30;
  if (in.numel() < kMax32 && out.numel() < kMax32) {
    f.template operator()<int32_t>();
  } else {
    f.template operator()<int64_t>();
  }
}

/// Element i of an [N, height, width, groups] tensor as its image, row, column and channel group.
template <class Index>
struct NhwcPosition {
  Index n, h, w, group;
};

template <class Index>
__device__ __forceinline__ NhwcPosition<Index> nhwc_position(Index i, Index height, Index width, Index groups) {
  const Index pixel = i / groups;
  return {pixel / (width * height), (pixel / width) % height, pixel % width, i % groups};
}

/// kVec window offsets, moved as one integer of kVec bytes.
template <int kVec>
struct Offsets {
  uint8_t v[kVec];
};

template <class T, int kVec, class Index>
__global__ void max_pool_nhwc_forward_kernel(T* out, uint8_t* offsets, const T* x, NhwcSizes<Index> p,
                                             Geometry<Index> g) {
  using A = acc_t<T>;
  using Group = core::cuda_detail::Vec<T, kVec>;
  const Index total = p.batch * p.out_height * p.out_width * p.groups;
  for (Index o = blockIdx.x * Index(blockDim.x) + threadIdx.x; o < total; o += Index(gridDim.x) * blockDim.x) {
    const auto [n, oh, ow, group] = nhwc_position(o, p.out_height, p.out_width, p.groups);
    const T* src = x + (int64_t{n} * p.height * p.width * p.groups + group) * kVec;
    const Index h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
    const Window<Index> wh = window(oh, g.stride_h, g.pad_h, g.kernel_h, p.height);
    const Window<Index> ww = window(ow, g.stride_w, g.pad_w, g.kernel_w, p.width);
    A best[kVec];
    Offsets<kVec> where;
    {
      const Group first =
          *reinterpret_cast<const Group*>(src + (int64_t{wh.start} * p.width + ww.start) * p.groups * kVec);
      const auto offset = static_cast<uint8_t>((wh.start - h0) * g.kernel_w + (ww.start - w0));
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        best[k] = static_cast<A>(first.v[k]);
        where.v[k] = offset;
      }
    }
    for (Index h = wh.start; h < wh.end; ++h) {
      for (Index w = ww.start; w < ww.end; ++w) {
        const Group v = *reinterpret_cast<const Group*>(src + (int64_t{h} * p.width + w) * p.groups * kVec);
        const auto offset = static_cast<uint8_t>((h - h0) * g.kernel_w + (w - w0));
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const A value = static_cast<A>(v.v[k]);
          if (value > best[k] || value != value) {
            best[k] = value;
            where.v[k] = offset;
          }
        }
      }
    }
    Group result;
#pragma unroll
    for (int k = 0; k < kVec; ++k) result.v[k] = store_as<T>(best[k]);
    *reinterpret_cast<Group*>(out + int64_t{o} * kVec) = result;
    *reinterpret_cast<Offsets<kVec>*>(offsets + int64_t{o} * kVec) = where;
  }
}

template <class T, int kVec, class Index>
__global__ void max_pool_nhwc_backward_kernel(T* grad_x, const T* grad_out, const uint8_t* offsets, NhwcSizes<Index> p,
                                              Geometry<Index> g) {
  using A = acc_t<T>;
  using Group = core::cuda_detail::Vec<T, kVec>;
  const Index total = p.batch * p.height * p.width * p.groups;
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < total; i += Index(gridDim.x) * blockDim.x) {
    const auto [n, h, w, group] = nhwc_position(i, p.height, p.width, p.groups);
    Index oh_first, oh_last, ow_first, ow_last;
    covering_outputs(h, g.stride_h, g.pad_h, g.kernel_h, p.out_height, oh_first, oh_last);
    covering_outputs(w, g.stride_w, g.pad_w, g.kernel_w, p.out_width, ow_first, ow_last);
    const int64_t base = int64_t{n} * p.out_height * p.out_width;
    A total_grad[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) total_grad[k] = A(0);
    for (Index oh = oh_first; oh <= oh_last; ++oh) {
      for (Index ow = ow_first; ow <= ow_last; ++ow) {
        const auto mine =
            static_cast<uint8_t>((h - (oh * g.stride_h - g.pad_h)) * g.kernel_w + (w - (ow * g.stride_w - g.pad_w)));
        const int64_t o = ((base + int64_t{oh} * p.out_width + ow) * p.groups + group) * kVec;
        const Offsets<kVec> where = *reinterpret_cast<const Offsets<kVec>*>(offsets + o);
        bool any = false;
#pragma unroll
        for (int k = 0; k < kVec; ++k) any = any || where.v[k] == mine;
        if (!any) continue;
        const Group grad = *reinterpret_cast<const Group*>(grad_out + o);
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          if (where.v[k] == mine) total_grad[k] += static_cast<A>(grad.v[k]);
        }
      }
    }
    Group result;
#pragma unroll
    for (int k = 0; k < kVec; ++k) result.v[k] = store_as<T>(total_grad[k]);
    *reinterpret_cast<Group*>(grad_x + int64_t{i} * kVec) = result;
  }
}

/// 16 bytes of T per thread when C holds whole groups and every pointer is aligned for its vector.
template <class T>
int nhwc_vec(const Tensor& image, std::initializer_list<const void*> values, const void* offsets) {
  constexpr int kVec = 16 / sizeof(T);
  bool ok = kVec > 1 && image.size(3) % kVec == 0 && reinterpret_cast<uintptr_t>(offsets) % kVec == 0;
  for (const void* p : values) ok = ok && core::cuda_detail::aligned16(p);
  return ok ? kVec : 1;
}

/// Calls launch.template operator()<kVec>() with kVec = 16 bytes of T when `vec` > 1, else 1.
template <class T, class Launch>
void launch_with_vec(int vec, const Launch& launch) {
  if (vec > 1) {
    launch.template operator()<16 / sizeof(T)>();
  } else {
    launch.template operator()<1>();
  }
  COLOSSAL_CUDA_CHECK_LAUNCH();
}

void max_pool2d_nhwc_forward_cuda(const Tensor& out, const Tensor& indices, const Tensor& x,
                                  const Pool2dGeometry& geometry) {
  check_on_device(out, x.device(), "max_pool2d (nhwc)", "out");
  check_on_device(indices, x.device(), "max_pool2d (nhwc)", "indices");
  COLOSSAL_CHECK(indices.dtype() == DType::u8 && geometry.kernel_h * geometry.kernel_w <= 256,
                 "max_pool2d (nhwc, CUDA): expects u8 window offsets and windows of at most 256 positions");
  core::cuda::DeviceGuard guard(x.device());
  core::dispatch_floating(x.dtype(), "max_pool2d (nhwc)", [&]<class T>() {
    const int vec = nhwc_vec<T>(x, {x.raw_data(), out.raw_data()}, indices.raw_data());
    dispatch_nhwc_index_width(x, out, [&]<class Index>() {
      launch_with_vec<T>(vec, [&]<int kVec>() {
        max_pool_nhwc_forward_kernel<T, kVec, Index><<<grid_for(out.numel() / kVec), kThreads, 0, stream_of(x)>>>(
            out.data<T>(), indices.data<uint8_t>(), x.data<T>(), nhwc_sizes<Index>(x, out, kVec),
            device_geometry<Index>(geometry));
      });
    });
  });
}

void max_pool2d_nhwc_backward_cuda(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices,
                                   const Pool2dGeometry& geometry) {
  check_on_device(grad_out, grad_x.device(), "max_pool2d_backward (nhwc)", "grad_out");
  check_on_device(indices, grad_x.device(), "max_pool2d_backward (nhwc)", "indices");
  core::cuda::DeviceGuard guard(grad_x.device());
  core::dispatch_floating(grad_x.dtype(), "max_pool2d_backward (nhwc)", [&]<class T>() {
    const int vec = nhwc_vec<T>(grad_x, {grad_x.raw_data(), grad_out.raw_data()}, indices.raw_data());
    dispatch_nhwc_index_width(grad_x, grad_out, [&]<class Index>() {
      launch_with_vec<T>(vec, [&]<int kVec>() {
        max_pool_nhwc_backward_kernel<T, kVec, Index>
            <<<grid_for(grad_x.numel() / kVec), kThreads, 0, stream_of(grad_x)>>>(
                grad_x.data<T>(), grad_out.data<T>(), indices.data<uint8_t>(),
                nhwc_sizes<Index>(grad_x, grad_out, kVec), device_geometry<Index>(geometry));
      });
    });
  });
}

// ---- avg_pool2d

template <class Index>
__device__ __forceinline__ Index divisor(const Window<Index>& wh, const Window<Index>& ww, bool count_include_pad) {
  return count_include_pad ? wh.padded_size * ww.padded_size : (wh.end - wh.start) * (ww.end - ww.start);
}

template <class T, class Index>
__global__ void avg_pool_forward_kernel(T* out, const T* x, PlaneSizes<Index> p, Geometry<Index> g) {
  using A = acc_t<T>;
  const Index total = p.planes * p.out_height * p.out_width;
  for (Index o = blockIdx.x * Index(blockDim.x) + threadIdx.x; o < total; o += Index(gridDim.x) * blockDim.x) {
    const Index ow = o % p.out_width;
    const Index oh = (o / p.out_width) % p.out_height;
    const Index plane = o / (p.out_width * p.out_height);
    const T* src = x + int64_t{plane} * p.height * p.width;
    const Window<Index> wh = window(oh, g.stride_h, g.pad_h, g.kernel_h, p.height);
    const Window<Index> ww = window(ow, g.stride_w, g.pad_w, g.kernel_w, p.width);
    A total_value = A(0);
    for (Index h = wh.start; h < wh.end; ++h) {
      for (Index w = ww.start; w < ww.end; ++w) total_value += static_cast<A>(src[h * p.width + w]);
    }
    out[o] = store_as<T>(total_value / static_cast<A>(divisor(wh, ww, g.count_include_pad)));
  }
}

void avg_pool2d_forward_cuda(const Tensor& out, const Tensor& x, const Pool2dGeometry& geometry) {
  check_on_device(out, x.device(), "avg_pool2d", "out");
  core::cuda::DeviceGuard guard(x.device());
  core::dispatch_floating(x.dtype(), "avg_pool2d", [&]<class T>() {
    dispatch_index_width(x, out, [&]<class Index>() {
      avg_pool_forward_kernel<T, Index><<<grid_for(out.numel()), kThreads, 0, stream_of(x)>>>(
          out.data<T>(), x.data<T>(), plane_sizes<Index>(x, out), device_geometry<Index>(geometry));
      COLOSSAL_CUDA_CHECK_LAUNCH();
    });
  });
}

template <class T, class Index>
__global__ void avg_pool_backward_kernel(T* grad_x, const T* grad_out, PlaneSizes<Index> p, Geometry<Index> g) {
  using A = acc_t<T>;
  const Index total = p.planes * p.height * p.width;
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < total; i += Index(gridDim.x) * blockDim.x) {
    const Index w = i % p.width;
    const Index h = (i / p.width) % p.height;
    const Index plane = i / (p.width * p.height);
    Index oh_first, oh_last, ow_first, ow_last;
    covering_outputs(h, g.stride_h, g.pad_h, g.kernel_h, p.out_height, oh_first, oh_last);
    covering_outputs(w, g.stride_w, g.pad_w, g.kernel_w, p.out_width, ow_first, ow_last);
    const T* dy = grad_out + int64_t{plane} * p.out_height * p.out_width;
    A total_grad = A(0);
    for (Index oh = oh_first; oh <= oh_last; ++oh) {
      const Window<Index> wh = window(oh, g.stride_h, g.pad_h, g.kernel_h, p.height);
      for (Index ow = ow_first; ow <= ow_last; ++ow) {
        const Window<Index> ww = window(ow, g.stride_w, g.pad_w, g.kernel_w, p.width);
        // The CPU adds dy / divisor, not dy * (1 / divisor): keep its rounding.
        total_grad += static_cast<A>(dy[oh * p.out_width + ow]) / static_cast<A>(divisor(wh, ww, g.count_include_pad));
      }
    }
    grad_x[i] = store_as<T>(total_grad);
  }
}

void avg_pool2d_backward_cuda(const Tensor& grad_x, const Tensor& grad_out, const Pool2dGeometry& geometry) {
  check_on_device(grad_out, grad_x.device(), "avg_pool2d_backward", "grad_out");
  core::cuda::DeviceGuard guard(grad_x.device());
  core::dispatch_floating(grad_x.dtype(), "avg_pool2d_backward", [&]<class T>() {
    dispatch_index_width(grad_x, grad_out, [&]<class Index>() {
      avg_pool_backward_kernel<T, Index><<<grid_for(grad_x.numel()), kThreads, 0, stream_of(grad_x)>>>(
          grad_x.data<T>(), grad_out.data<T>(), plane_sizes<Index>(grad_x, grad_out), device_geometry<Index>(geometry));
      COLOSSAL_CUDA_CHECK_LAUNCH();
    });
  });
}

// ---- adaptive_avg_pool2d

template <class T, class Index>
__global__ void adaptive_avg_pool_forward_kernel(T* out, const T* x, PlaneSizes<Index> p) {
  using A = acc_t<T>;
  const Index total = p.planes * p.out_height * p.out_width;
  for (Index o = blockIdx.x * Index(blockDim.x) + threadIdx.x; o < total; o += Index(gridDim.x) * blockDim.x) {
    const Index ow = o % p.out_width;
    const Index oh = (o / p.out_width) % p.out_height;
    const Index plane = o / (p.out_width * p.out_height);
    const T* src = x + int64_t{plane} * p.height * p.width;
    const Window<Index> wh = adaptive_window(oh, p.out_height, p.height);
    const Window<Index> ww = adaptive_window(ow, p.out_width, p.width);
    A total_value = A(0);
    for (Index h = wh.start; h < wh.end; ++h) {
      for (Index w = ww.start; w < ww.end; ++w) total_value += static_cast<A>(src[h * p.width + w]);
    }
    out[o] = store_as<T>(total_value / static_cast<A>(wh.padded_size * ww.padded_size));
  }
}

template <class T, class Index>
__global__ void adaptive_avg_pool_backward_kernel(T* grad_x, const T* grad_out, PlaneSizes<Index> p) {
  using A = acc_t<T>;
  const Index total = p.planes * p.height * p.width;
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < total; i += Index(gridDim.x) * blockDim.x) {
    const Index w = i % p.width;
    const Index h = (i / p.width) % p.height;
    const Index plane = i / (p.width * p.height);
    Index oh_first, oh_last, ow_first, ow_last;
    covering_adaptive_outputs(h, p.out_height, p.height, oh_first, oh_last);
    covering_adaptive_outputs(w, p.out_width, p.width, ow_first, ow_last);
    const T* dy = grad_out + int64_t{plane} * p.out_height * p.out_width;
    A total_grad = A(0);
    for (Index oh = oh_first; oh <= oh_last; ++oh) {
      const Window<Index> wh = adaptive_window(oh, p.out_height, p.height);
      for (Index ow = ow_first; ow <= ow_last; ++ow) {
        const Window<Index> ww = adaptive_window(ow, p.out_width, p.width);
        total_grad += static_cast<A>(dy[oh * p.out_width + ow]) / static_cast<A>(wh.padded_size * ww.padded_size);
      }
    }
    grad_x[i] = store_as<T>(total_grad);
  }
}

void adaptive_avg_pool2d_forward_cuda(const Tensor& out, const Tensor& x) {
  check_on_device(out, x.device(), "adaptive_avg_pool2d", "out");
  core::cuda::DeviceGuard guard(x.device());
  core::dispatch_floating(x.dtype(), "adaptive_avg_pool2d", [&]<class T>() {
    dispatch_index_width(x, out, [&]<class Index>() {
      adaptive_avg_pool_forward_kernel<T, Index><<<grid_for(out.numel()), kThreads, 0, stream_of(x)>>>(
          out.data<T>(), x.data<T>(), plane_sizes<Index>(x, out));
      COLOSSAL_CUDA_CHECK_LAUNCH();
    });
  });
}

void adaptive_avg_pool2d_backward_cuda(const Tensor& grad_x, const Tensor& grad_out) {
  check_on_device(grad_out, grad_x.device(), "adaptive_avg_pool2d_backward", "grad_out");
  core::cuda::DeviceGuard guard(grad_x.device());
  core::dispatch_floating(grad_x.dtype(), "adaptive_avg_pool2d_backward", [&]<class T>() {
    dispatch_index_width(grad_x, grad_out, [&]<class Index>() {
      adaptive_avg_pool_backward_kernel<T, Index><<<grid_for(grad_x.numel()), kThreads, 0, stream_of(grad_x)>>>(
          grad_x.data<T>(), grad_out.data<T>(), plane_sizes<Index>(grad_x, grad_out));
      COLOSSAL_CUDA_CHECK_LAUNCH();
    });
  });
}

COLOSSAL_REGISTER_KERNEL(max_pool2d_forward_stub, core::DeviceType::cuda, max_pool2d_forward_cuda);
COLOSSAL_REGISTER_KERNEL(max_pool2d_backward_stub, core::DeviceType::cuda, max_pool2d_backward_cuda);
COLOSSAL_REGISTER_KERNEL(max_pool2d_nhwc_forward_stub, core::DeviceType::cuda, max_pool2d_nhwc_forward_cuda);
COLOSSAL_REGISTER_KERNEL(max_pool2d_nhwc_backward_stub, core::DeviceType::cuda, max_pool2d_nhwc_backward_cuda);
COLOSSAL_REGISTER_KERNEL(avg_pool2d_forward_stub, core::DeviceType::cuda, avg_pool2d_forward_cuda);
COLOSSAL_REGISTER_KERNEL(avg_pool2d_backward_stub, core::DeviceType::cuda, avg_pool2d_backward_cuda);
COLOSSAL_REGISTER_KERNEL(adaptive_avg_pool2d_forward_stub, core::DeviceType::cuda, adaptive_avg_pool2d_forward_cuda);
COLOSSAL_REGISTER_KERNEL(adaptive_avg_pool2d_backward_stub, core::DeviceType::cuda, adaptive_avg_pool2d_backward_cuda);

}  // namespace
}  // namespace colossal::ops
