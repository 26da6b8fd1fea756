// The multi-tensor kernels of gradient clipping: the sum of squares of many tensors (optionally
// scaling them in place first: mixed precision's unscale) in one pass, and the in-place scaling by a
// device scalar. See Note [Clipping in one pass] in clip_grad.cpp and Note [Fused optimizer kernels]
// in multi_tensor_apply.cuh.
#include <vector>

#include "colossal/optim/clip_grad.h"                  // sum_of_squares_stub, scale_stub
#include "colossal/optim/cuda/multi_tensor_apply.cuh"  // multi_tensor_kernel, for_each_table

namespace colossal::optim {
namespace {

using namespace cuda_detail;

// Note [Sums of squares in one order]
// Mixed precision's fused step (Note [Fused mixed-precision step] in amp/mixed_precision_optimizer.cpp)
// takes the overflow check and the clipping norm from the 16-bit gradients themselves where the
// three-pass step took them from their f32 copies, and the norm must come out the same bits. The
// values are the same (a 16-bit number is exact in f32 and its square exact in f64), so the order of
// the f64 additions must be too: each thread sums the elements of vectors of acc_t's width (four for
// f32, bf16 and f16 alike: kVecElements), and a misaligned chunk is visited in that same order one
// element at a time (multi_tensor_kernel), so a tensor's sum does not depend on its dtype's width or
// on where it starts. Chunks and their partials are laid out by element counts alone.

/// Column 0 is the tensor. With Scale, x <- round(x * scale) is written back first (ops::mul_ by a
/// host scalar: the scalar converted to acc_t, one rounding). Adds x * x, squared in f64 (no f32
/// square overflows, so the sum is non-finite exactly when some x is), to sums[0].
template <class T, bool Scale>
struct SumSquares {
  using A = core::acc_t<T>;
  static constexpr int kDepth = 1;
  static constexpr int kNorms = 2;
  /// Note [Sums of squares in one order]: a 16-bit tensor sums in its f32 copy's order.
  static constexpr int kVecElements = static_cast<int>(16 / sizeof(A));
  static constexpr unsigned kWrites = Scale ? 1u : 0u;
  struct Context {};
  A scale;

  template <class S>
  __device__ Context context(int, const S*) const {
    return {};
  }
  __device__ void operator()(A (&x)[1], const Context&, NormSum (&sums)[2]) const {
    if constexpr (Scale) x[0] = round_to<T>(x[0] * scale);
    sums[0] += static_cast<NormSum>(x[0]) * static_cast<NormSum>(x[0]);
  }
};

/// x <- round(x * *scale), the scale an f64 device scalar read once per block and rounded to acc_t
/// (optim::scale_for), the product in acc_t, one rounding.
template <class T>
struct ScaleBy {
  using A = core::acc_t<T>;
  static constexpr int kDepth = 1;
  static constexpr int kNorms = 0;
  static constexpr unsigned kWrites = 1u;
  struct Context {
    A scale;
  };
  const double* scale;

  template <class S>
  __device__ Context context(int, const S*) const {
    return {static_cast<A>(*scale)};
  }
  __device__ void operator()(A (&x)[1], const Context& c, NormSum (&)[2]) const { x[0] = round_to<T>(x[0] * c.scale); }
};

using OneColumn = TensorTable<1, float, 1>;

/// Sums the even entries (sums[0] of each chunk) of partials[0, 2 * chunks) in a fixed order into *out.
__global__ void __launch_bounds__(kFinishThreads)
    sum_partials_kernel(const NormSum* __restrict__ partials, int64_t chunks, double* __restrict__ out) {
  NormSum sums[2] = {0.0, 0.0};
  for (int64_t c = threadIdx.x; c < chunks; c += kFinishThreads) sums[0] += partials[2 * c];
  block_sum2<kFinishThreads>(sums);
  if (threadIdx.x == 0) *out = sums[0];
}

/// The tensors grouped by dtype, each group's TensorArgs (Note [Fused optimizer kernels]).
std::vector<std::vector<TensorArgs<OneColumn>>> args_by_dtype(const std::vector<Tensor>& tensors,
                                                              std::vector<DType>& dtypes) {
  std::vector<std::vector<TensorArgs<OneColumn>>> groups;
  for (const Tensor& t : tensors) {
    size_t g = 0;
    while (g < dtypes.size() && dtypes[g] != t.dtype()) ++g;
    if (g == dtypes.size()) {
      dtypes.push_back(t.dtype());
      groups.emplace_back();
    }
    TensorArgs<OneColumn> arg;
    arg.data[0] = t.raw_data();
    arg.numel = t.numel();
    groups[g].push_back(arg);
  }
  return groups;
}

Tensor sum_of_squares_cuda(const std::vector<Tensor>& tensors, double scale) {
  const Device device = tensors.front().device();
  core::cuda::DeviceGuard guard(device);
  const cudaStream_t stream = core::cuda_detail::stream_of(tensors.front());
  std::vector<DType> dtypes;
  const auto groups = args_by_dtype(tensors, dtypes);
  int64_t total_chunks = 0;
  for (const auto& group : groups) {
    for (const auto& arg : group) total_chunks += chunks_of(arg.numel);
  }
  const Tensor out = core::empty({}, TensorOptions(DType::f64, device));
  const Tensor partials = core::empty({2 * total_chunks}, TensorOptions(core::dtype_of<NormSum>(), device));
  int64_t group_base = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    core::dispatch_floating(dtypes[g], "sum_of_squares", [&]<class T>() {
      using A = core::acc_t<T>;
      auto launch = [&](const auto& op) {
        for_each_table(groups[g], [&](const OneColumn& table, int blocks, int64_t chunk_base) {
          NormSum* p = partials.data<NormSum>() + 2 * (group_base + chunk_base);
          multi_tensor_kernel<T><<<static_cast<unsigned>(blocks), kBlockThreads, 0, stream>>>(table, op, p);
          COLOSSAL_CUDA_CHECK_LAUNCH();
        });
      };
      if (scale != 1.0) {
        launch(SumSquares<T, true>{static_cast<A>(scale)});
      } else {
        launch(SumSquares<T, false>{static_cast<A>(1)});
      }
    });
    for (const auto& arg : groups[g]) group_base += chunks_of(arg.numel);
  }
  sum_partials_kernel<<<1, kFinishThreads, 0, stream>>>(partials.data<NormSum>(), total_chunks, out.data<double>());
  COLOSSAL_CUDA_CHECK_LAUNCH();
  return out;
}

void scale_cuda(const std::vector<Tensor>& tensors, const Tensor& scale) {
  const Device device = scale.device();
  core::cuda::DeviceGuard guard(device);
  const Tensor factor = scale.dtype() == DType::f64 ? scale.contiguous() : scale.to(DType::f64);
  const cudaStream_t stream = core::cuda_detail::stream_of(tensors.front());
  std::vector<DType> dtypes;
  const auto groups = args_by_dtype(tensors, dtypes);
  for (size_t g = 0; g < groups.size(); ++g) {
    core::dispatch_floating(dtypes[g], "scale_",
                            [&]<class T>() { launch_update<T>(groups[g], ScaleBy<T>{factor.data<double>()}, stream); });
  }
}

COLOSSAL_REGISTER_KERNEL(sum_of_squares_stub, core::DeviceType::cuda, sum_of_squares_cuda);
COLOSSAL_REGISTER_KERNEL(scale_stub, core::DeviceType::cuda, scale_cuda);

}  // namespace
}  // namespace colossal::optim
