// CPU conv2d forward and backward: im2col + OpenBLAS GEMM (f32/f64; f16/bf16 staged through f32).
// Images are processed in chunks whose column matrices are laid side by side, so each group's
// GEMM sees many columns even for small feature maps, while the buffer stays bounded.
#include <cblas.h>  // cblas_sgemm, cblas_dgemm

#include <algorithm>
#include <vector>

#include "colossal/core/parallel_for.h"  // parallel_for
#include "colossal/core/view.h"          // cast_raw
#include "colossal/ops/conv_kernels.h"   // stubs, Conv2dGeometry

namespace colossal::ops {
namespace {

/// Elements a chunk's column matrix may hold (32 MiB of f32); at least one image always fits.
constexpr int64_t kColumnBudget = int64_t{8} << 20;

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
          int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b,
          int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), 1.0, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

/// Sizes derived from the geometry that every loop below needs.
struct ConvDims {
  explicit ConvDims(const Conv2dGeometry& g)
      : channels_per_group(g.in_channels / g.groups),
        out_per_group(g.out_channels / g.groups),
        kernel_area(g.kernel_height * g.kernel_width),
        rows(g.in_channels * kernel_area),
        rows_per_group(channels_per_group * kernel_area),
        out_area(g.out_height * g.out_width),
        in_area(g.in_height * g.in_width),
        chunk(std::clamp<int64_t>(kColumnBudget / std::max<int64_t>(rows * out_area, 1), 1, g.batch)) {}
  int64_t channels_per_group, out_per_group, kernel_area, rows, rows_per_group, out_area, in_area, chunk;
};

/// col[r, b * L + l] <- x[b, c, ih, iw] (0 in the padding) for images [0, images) of `x`, where
/// r = (c * kH + kh) * kW + kw, l = oh * oW + ow, ih = oh * sH - pH + kh * dH (likewise iw), and
/// the column matrix has `images * L` columns.
template <class T>
void im2col(T* col, const T* x, int64_t images, const Conv2dGeometry& g, const ConvDims& d) {
  const int64_t cols = images * d.out_area;
  core::parallel_for(0, d.rows, std::max<int64_t>(1, core::kParallelGrain / std::max<int64_t>(cols, 1)),
                     [&](int64_t begin, int64_t end) {
                       for (int64_t r = begin; r < end; ++r) {
                         const int64_t c = r / d.kernel_area;
                         const int64_t kh = (r / g.kernel_width) % g.kernel_height;
                         const int64_t kw = r % g.kernel_width;
                         T* dst = col + r * cols;
                         for (int64_t b = 0; b < images; ++b) {
                           const T* plane = x + (b * g.in_channels + c) * d.in_area;
                           for (int64_t oh = 0; oh < g.out_height; ++oh) {
                             const int64_t ih = oh * g.stride_h - g.pad_h + kh * g.dilation_h;
                             const bool row_inside = ih >= 0 && ih < g.in_height;
                             for (int64_t ow = 0; ow < g.out_width; ++ow) {
                               const int64_t iw = ow * g.stride_w - g.pad_w + kw * g.dilation_w;
                               *dst++ = row_inside && iw >= 0 && iw < g.in_width ? plane[ih * g.in_width + iw] : T(0);
                             }
                           }
                         }
                       }
                     });
}

/// The adjoint of im2col: grad_x[b, c, ih, iw] <- the sum of the col entries im2col read it into.
/// Each (image, channel) plane is written by one thread only, so there are no races.
template <class T>
void col2im(T* grad_x, const T* col, int64_t images, const Conv2dGeometry& g, const ConvDims& d) {
  const int64_t cols = images * d.out_area;
  core::parallel_for(0, images * g.in_channels,
                     std::max<int64_t>(1, core::kParallelGrain / std::max<int64_t>(d.kernel_area * d.out_area, 1)),
                     [&](int64_t begin, int64_t end) {
                       for (int64_t plane_index = begin; plane_index < end; ++plane_index) {
                         const int64_t b = plane_index / g.in_channels;
                         const int64_t c = plane_index % g.in_channels;
                         T* plane = grad_x + plane_index * d.in_area;
                         std::fill(plane, plane + d.in_area, T(0));
                         for (int64_t k = 0; k < d.kernel_area; ++k) {
                           const int64_t kh = k / g.kernel_width;
                           const int64_t kw = k % g.kernel_width;
                           const T* src = col + (c * d.kernel_area + k) * cols + b * d.out_area;
                           for (int64_t oh = 0; oh < g.out_height; ++oh) {
                             const int64_t ih = oh * g.stride_h - g.pad_h + kh * g.dilation_h;
                             if (ih < 0 || ih >= g.in_height) continue;
                             for (int64_t ow = 0; ow < g.out_width; ++ow) {
                               const int64_t iw = ow * g.stride_w - g.pad_w + kw * g.dilation_w;
                               if (iw >= 0 && iw < g.in_width)
                                 plane[ih * g.in_width + iw] += src[oh * g.out_width + ow];
                             }
                           }
                         }
                       }
                     });
}

template <class T>
void conv2d_forward_typed(T* out, const T* x, const T* weight, const T* bias, const Conv2dGeometry& g) {
  const ConvDims d(g);
  std::vector<T> col(static_cast<size_t>(d.rows * d.chunk * d.out_area));
  std::vector<T> result(static_cast<size_t>(g.out_channels * d.chunk * d.out_area));
  for (int64_t n0 = 0; n0 < g.batch; n0 += d.chunk) {
    const int64_t images = std::min(d.chunk, g.batch - n0);
    const int64_t cols = images * d.out_area;
    im2col(col.data(), x + n0 * g.in_channels * d.in_area, images, g, d);
    for (int64_t group = 0; group < g.groups; ++group) {
      gemm(false, false, d.out_per_group, cols, d.rows_per_group, weight + group * d.out_per_group * d.rows_per_group,
           d.rows_per_group, col.data() + group * d.rows_per_group * cols, cols, T(0),
           result.data() + group * d.out_per_group * cols, cols);
    }
    // result is [O, images * L]; the output wants [images, O, L].
    T* out_chunk = out + n0 * g.out_channels * d.out_area;
    core::parallel_for(0, images * g.out_channels, std::max<int64_t>(1, core::kParallelGrain / d.out_area),
                       [&](int64_t begin, int64_t end) {
                         for (int64_t i = begin; i < end; ++i) {
                           const int64_t b = i / g.out_channels, o = i % g.out_channels;
                           const T shift = bias != nullptr ? bias[o] : T(0);
                           const T* src = result.data() + o * cols + b * d.out_area;
                           T* dst = out_chunk + i * d.out_area;
                           for (int64_t l = 0; l < d.out_area; ++l) dst[l] = src[l] + shift;
                         }
                       });
  }
}

template <class T>
void conv2d_backward_typed(T* grad_x, T* grad_weight, T* grad_bias, const T* grad_out, const T* x, const T* weight,
                           const Conv2dGeometry& g) {
  const ConvDims d(g);
  if (grad_bias != nullptr) {
    core::parallel_for(0, g.out_channels, 1, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) {
        double total = 0.0;  // N * L terms: f32 would drift
        for (int64_t n = 0; n < g.batch; ++n) {
          const T* src = grad_out + (n * g.out_channels + o) * d.out_area;
          for (int64_t l = 0; l < d.out_area; ++l) total += static_cast<double>(src[l]);
        }
        grad_bias[o] = static_cast<T>(total);
      }
    });
  }
  if (grad_x == nullptr && grad_weight == nullptr) return;
  if (grad_weight != nullptr) std::fill(grad_weight, grad_weight + g.out_channels * d.rows_per_group, T(0));
  std::vector<T> col(static_cast<size_t>(d.rows * d.chunk * d.out_area));
  std::vector<T> gathered(static_cast<size_t>(g.out_channels * d.chunk * d.out_area));
  for (int64_t n0 = 0; n0 < g.batch; n0 += d.chunk) {
    const int64_t images = std::min(d.chunk, g.batch - n0);
    const int64_t cols = images * d.out_area;
    // grad_out's chunk as [O, images * L], the layout the forward GEMM produced.
    const T* grad_chunk = grad_out + n0 * g.out_channels * d.out_area;
    core::parallel_for(0, images * g.out_channels, std::max<int64_t>(1, core::kParallelGrain / d.out_area),
                       [&](int64_t begin, int64_t end) {
                         for (int64_t i = begin; i < end; ++i) {
                           const int64_t b = i / g.out_channels, o = i % g.out_channels;
                           std::copy_n(grad_chunk + i * d.out_area, d.out_area,
                                       gathered.data() + o * cols + b * d.out_area);
                         }
                       });
    if (grad_weight != nullptr) {
      im2col(col.data(), x + n0 * g.in_channels * d.in_area, images, g, d);
      for (int64_t group = 0; group < g.groups; ++group) {
        gemm(false, true, d.out_per_group, d.rows_per_group, cols, gathered.data() + group * d.out_per_group * cols,
             cols, col.data() + group * d.rows_per_group * cols, cols, T(1),
             grad_weight + group * d.out_per_group * d.rows_per_group, d.rows_per_group);
      }
    }
    if (grad_x != nullptr) {
      // The column buffer is free again: it now receives the gradient of the columns.
      for (int64_t group = 0; group < g.groups; ++group) {
        gemm(true, false, d.rows_per_group, cols, d.out_per_group, weight + group * d.out_per_group * d.rows_per_group,
             d.rows_per_group, gathered.data() + group * d.out_per_group * cols, cols, T(0),
             col.data() + group * d.rows_per_group * cols, cols);
      }
      col2im(grad_x + n0 * g.in_channels * d.in_area, col.data(), images, g, d);
    }
  }
}

template <class T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

/// f16/bf16 tensors become f32 copies (undefined stays undefined); BLAS has no half GEMM on the CPU.
Tensor as_f32(const Tensor& t) {
  return t.defined() ? core::cast_raw(t, DType::f32) : Tensor();
}
Tensor empty_f32_like(const Tensor& t) {
  return t.defined() ? core::empty(t.shape(), DType::f32) : Tensor();
}

void conv2d_forward_cpu(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const Conv2dGeometry& geometry) {
  core::dispatch_floating(x.dtype(), "conv2d", [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      conv2d_forward_typed<T>(out.data<T>(), x.data<T>(), weight.data<T>(), data_or_null<T>(bias), geometry);
    } else {
      const Tensor out_f32 = core::empty(out.shape(), DType::f32);
      const Tensor bias_f32 = as_f32(bias);
      conv2d_forward_typed<float>(out_f32.data<float>(), as_f32(x).data<float>(), as_f32(weight).data<float>(),
                                  data_or_null<float>(bias_f32), geometry);
      Tensor(out).copy_(out_f32);
    }
  });
}

void conv2d_backward_cpu(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                         const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                         const Conv2dGeometry& geometry) {
  core::dispatch_floating(x.dtype(), "conv2d_backward", [&]<class T>() {
    auto mutable_data = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      conv2d_backward_typed<T>(mutable_data(grad_x), mutable_data(grad_weight), mutable_data(grad_bias),
                               grad_out.data<T>(), x.data<T>(), weight.data<T>(), geometry);
    } else {
      const Tensor grad_x_f32 = empty_f32_like(grad_x);
      const Tensor grad_weight_f32 = empty_f32_like(grad_weight);
      const Tensor grad_bias_f32 = empty_f32_like(grad_bias);
      auto f32_data = [](const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; };
      conv2d_backward_typed<float>(f32_data(grad_x_f32), f32_data(grad_weight_f32), f32_data(grad_bias_f32),
                                   as_f32(grad_out).data<float>(), as_f32(x).data<float>(),
                                   as_f32(weight).data<float>(), geometry);
      for (auto [dst, src] : {std::pair{grad_x, grad_x_f32}, std::pair{grad_weight, grad_weight_f32},
                              std::pair{grad_bias, grad_bias_f32}}) {
        if (dst.defined()) Tensor(dst).copy_(src);
      }
    }
  });
}

}  // namespace

COLOSSAL_REGISTER_KERNEL(conv2d_forward_stub, core::DeviceType::cpu, conv2d_forward_cpu);
COLOSSAL_REGISTER_KERNEL(conv2d_backward_stub, core::DeviceType::cpu, conv2d_backward_cpu);

}  // namespace colossal::ops
