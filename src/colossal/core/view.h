// Raw (not recorded by autograd) view and copy primitives. The ops layer wraps each of these in a
// differentiable op; inside kernels and in core itself these are what to call.
#pragma once

#include <vector>

#include "colossal/core/dispatch.h"
#include "colossal/core/tensor.h"

namespace colossal::core {

/// A view with explicit shape, strides and offset (in elements) over t's storage.
Tensor as_strided(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset);
/// Resolves one -1 in `shape` against numel; throws naming both shapes when they do not match.
Shape infer_shape(const Shape& shape, int64_t numel);
/// View with a new shape, or an undefined Tensor when the strides make that impossible without a copy.
Tensor try_view(const Tensor& t, const Shape& shape);
/// View with a new shape; throws (suggesting reshape) when a copy would be needed.
Tensor view_raw(const Tensor& t, const Shape& shape);
Tensor permute_raw(const Tensor& t, const std::vector<int64_t>& dims);
Tensor transpose_raw(const Tensor& t, int64_t dim0, int64_t dim1);
/// Elements [start, end) with step along dim; start/end are clamped like Python slices.
Tensor slice_raw(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor narrow_raw(const Tensor& t, int64_t dim, int64_t start, int64_t length);
Tensor select_raw(const Tensor& t, int64_t dim, int64_t index);
Tensor unsqueeze_raw(const Tensor& t, int64_t dim);
Tensor squeeze_raw(const Tensor& t, int64_t dim);
/// Broadcast view to `shape` (stride 0 on expanded dims); -1 keeps a dimension's size.
Tensor expand_raw(const Tensor& t, const Shape& shape);
/// The broadcast shape of a and b under NumPy rules; throws naming both shapes and `op`.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op = "broadcast");
/// t itself if contiguous, else a contiguous copy.
Tensor contiguous_raw(const Tensor& t);
/// A contiguous copy of t converted to dtype (t itself if already contiguous of that dtype).
Tensor cast_raw(const Tensor& t, DType dtype);
/// A contiguous copy of t on `device`.
Tensor to_device_raw(const Tensor& t, Device device);

// Kernel stubs core needs for itself. The CPU kernels live in core/cpu_kernels.cpp; the CUDA
// backend registers its own.
/// dst <- src, src already broadcast to dst's shape; may differ in dtype and strides.
using CopyKernel = void(const Tensor& dst, const Tensor& src);
/// Every element of dst <- value.
using FillKernel = void(const Tensor& dst, double value);
/// dst += src, same shape and dtype (gradient accumulation).
using AccumulateKernel = void(const Tensor& dst, const Tensor& src);
/// dst[i] += src[i] for every pair, each contiguous, of one dtype and one device, no two dst alike:
/// one launch for them all where the backend batches (gradient accumulation of many small tensors).
using AccumulateManyKernel = void(const std::vector<Tensor>& dst, const std::vector<Tensor>& src);
/// Copy between devices (both contiguous, same dtype and size).
using CrossDeviceCopyKernel = void(const Tensor& dst, const Tensor& src);

extern DispatchStub<CopyKernel> copy_stub;
extern DispatchStub<FillKernel> fill_stub;
extern DispatchStub<AccumulateKernel> accumulate_stub;
extern DispatchStub<AccumulateManyKernel> accumulate_many_stub;
extern DispatchStub<CrossDeviceCopyKernel> cross_device_copy_stub;

/// dst += src in place (same shape and dtype), through accumulate_stub.
void accumulate_(const Tensor& dst, const Tensor& src);
/// accumulate_ for every pair (dst[i] += src[i]; each pair as accumulate_ takes it; no two
/// destinations the same tensor): the contiguous pairs of a dtype on a device whose backend batches
/// them (accumulate_many_stub: CUDA) in one launch per 64 pairs, the rest one by one. The same sums,
/// element for element, as accumulate_ pair by pair.
void accumulate_many_(const std::vector<Tensor>& dst, const std::vector<Tensor>& src);

}  // namespace colossal::core
