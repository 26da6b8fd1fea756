// Tensor itself: factories, metadata (shape, strides, offset, numel), element access, storage
// sharing between handles and views, the in-place fill_/zero_/copy_, and the errors bad input gets.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "colossal/core/tensor.h"
#include "colossal/core/view.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::core {
namespace {

std::vector<double> values_of(const Tensor& t) {
  return t.to_vector<double>();
}

TEST(TensorFactories, EmptyHasRowMajorMetadata) {
  Tensor t = empty({2, 3, 4});
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.offset(), 0);
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.dtype(), DType::f32);  // the default
  EXPECT_EQ(t.device(), kCpu);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.storage().nbytes(), 96u);
  EXPECT_EQ(t.raw_data(), t.storage().data());
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.stride(-3), 12);
  EXPECT_FALSE(t.requires_grad());
  EXPECT_TRUE(t.is_leaf());
}

TEST(TensorFactories, ElementSizeFollowsDtype) {
  const std::vector<std::pair<DType, size_t>> sizes = {{DType::f32, 4},  {DType::f64, 8},    {DType::f16, 2},
                                                       {DType::bf16, 2}, {DType::i32, 4},    {DType::i64, 8},
                                                       {DType::u8, 1},   {DType::boolean, 1}};
  for (const auto& [dtype, size] : sizes) {
    Tensor t = empty({5}, dtype);
    EXPECT_EQ(t.dtype(), dtype);
    EXPECT_EQ(t.element_size(), size) << dtype_name(dtype);
    EXPECT_EQ(t.nbytes(), 5 * size) << dtype_name(dtype);
    EXPECT_EQ(t.storage().nbytes(), 5 * size) << dtype_name(dtype);
  }
}

TEST(TensorFactories, ZerosOnesFull) {
  EXPECT_EQ(values_of(zeros({2, 2}, DType::i32)), (std::vector<double>{0, 0, 0, 0}));
  EXPECT_EQ(zeros({2, 2}, DType::i32).dtype(), DType::i32);
  EXPECT_EQ(values_of(ones({3}, DType::f64)), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(values_of(full({2, 2}, -2.5)), (std::vector<double>{-2.5, -2.5, -2.5, -2.5}));
  EXPECT_EQ(values_of(full({2}, 255.0, DType::u8)), (std::vector<double>{255, 255}));
  EXPECT_EQ(values_of(full({3}, 2.0, DType::boolean)), (std::vector<double>{1, 1, 1}));
}

TEST(TensorFactories, ScalarTensorIsZeroDimensional) {
  Tensor s = scalar_tensor(4.5, DType::f64);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.shape(), Shape{});
  EXPECT_EQ(s.strides(), Shape{});
  EXPECT_EQ(s.numel(), 1);
  EXPECT_TRUE(s.is_contiguous());
  EXPECT_EQ(s.item<double>(), 4.5);
  EXPECT_EQ(s.item<int>(), 4);  // truncates toward zero, like static_cast
  EXPECT_EQ(scalar_tensor(-1.0).item<float>(), -1.0f);
}

TEST(TensorFactories, Arange) {
  Tensor a = arange(0, 5);
  EXPECT_EQ(a.dtype(), DType::i64);  // the default for arange
  EXPECT_EQ(a.shape(), Shape{5});
  EXPECT_EQ(values_of(a), (std::vector<double>{0, 1, 2, 3, 4}));
  // 0.25 is exact in binary, so each start + i * step is exact.
  EXPECT_EQ(values_of(arange(1, 2, 0.25, DType::f64)), (std::vector<double>{1, 1.25, 1.5, 1.75}));
  EXPECT_EQ(values_of(arange(5, 0, -2, DType::i32)), (std::vector<double>{5, 3, 1}));
  // ceil((10 - 1) / 3) = 3: the end is exclusive even when it is not on the grid.
  EXPECT_EQ(values_of(arange(1, 10, 3)), (std::vector<double>{1, 4, 7}));
  EXPECT_EQ(arange(3, 3).numel(), 0);
  EXPECT_EQ(arange(3, 0).numel(), 0);  // a positive step never reaches a smaller end
  EXPECT_ERROR_CONTAINS(arange(0, 1, 0), "arange: step must be non-zero");
}

TEST(TensorFactories, FromVector) {
  Tensor t = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.dtype(), DType::f32);
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(t.data<float>()[4], 5.0f);

  // The options' dtype converts on the way in.
  Tensor d = from_vector<int32_t>({-1, 7}, {2}, DType::f64);
  EXPECT_EQ(d.dtype(), DType::f64);
  EXPECT_EQ(d.to_vector<double>(), (std::vector<double>{-1, 7}));

  Tensor b = from_vector<bool>({true, false, true}, {3});
  EXPECT_EQ(b.dtype(), DType::boolean);
  EXPECT_EQ(b.to_vector<bool>(), (std::vector<bool>{true, false, true}));

  Tensor none = from_vector<double>({}, {2, 0});
  EXPECT_EQ(none.numel(), 0);
  EXPECT_EQ(none.shape(), (Shape{2, 0}));
  EXPECT_TRUE(none.to_vector<double>().empty());
}

TEST(TensorFactories, RequiresGradOption) {
  Tensor t = ones({2}, TensorOptions(DType::f64, kCpu, /*rg=*/true));
  EXPECT_TRUE(t.requires_grad());
  EXPECT_TRUE(t.is_leaf());
  EXPECT_FALSE(t.detach().requires_grad());
  EXPECT_ERROR_CONTAINS(ones({2}, TensorOptions(DType::i64, kCpu, true)),
                        "only floating tensors can require gradients, got i64");
}

TEST(TensorFactories, RejectNegativeSizes) {
  EXPECT_ERROR_CONTAINS(empty({2, -1}), "empty: negative size in shape [2, -1]");
  EXPECT_ERROR_CONTAINS(zeros({-3}), "negative size in shape [-3]");
  EXPECT_ERROR_CONTAINS(from_vector<float>({}, {-1}), "from_vector: negative size in shape [-1]");
}

TEST(TensorFactories, FromVectorRejectsWrongCount) {
  EXPECT_ERROR_CONTAINS(from_vector<float>({1, 2, 3}, {2, 2}), "3 values do not fill shape [2, 2] (4 elements)");
  EXPECT_ERROR_CONTAINS(from_vector<int64_t>({1, 2}, {}), "2 values do not fill shape [] (1 elements)");
  EXPECT_NO_THROW(from_vector<int64_t>({1}, {}));  // a 0-d tensor holds exactly one value
}

TEST(TensorFactories, ZeroSizeTensors) {
  Tensor t = empty({0, 3});
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.nbytes(), 0u);
  EXPECT_EQ(t.strides(), (Shape{3, 1}));
  EXPECT_TRUE(t.is_contiguous());
  // Zero-size tensors are contiguous whatever their strides (there is nothing to lay out), as in
  // PyTorch; a size-0 trailing dimension makes the row-major strides themselves look non-dense.
  Tensor u = empty({3, 0});
  EXPECT_TRUE(u.is_contiguous());
  EXPECT_EQ(values_of(zeros({3, 0})), std::vector<double>{});
  u.fill_(1.0);  // nothing to fill, must not touch memory
  u.copy_(empty({0}));
}

TEST(TensorAccess, ItemNeedsExactlyOneElement) {
  EXPECT_EQ(from_vector<float>({2.5f}, {1, 1}).item<double>(), 2.5);
  EXPECT_ERROR_CONTAINS(from_vector<float>({1, 2}, {2}).item<float>(),
                        "item() needs a tensor with one element, got shape [2]");
  EXPECT_ERROR_CONTAINS(empty({0}).item<float>(), "got shape [0]");
  EXPECT_ERROR_CONTAINS(Tensor().item<float>(), "item() on an undefined tensor");
}

TEST(TensorAccess, ItemOfI64IsExactBeyondDoublePrecision) {
  // 2^53 + 1 has no double representation; item<int64_t> of an i64 must not go through double.
  const int64_t big = (int64_t{1} << 53) + 1;
  EXPECT_EQ(from_vector<int64_t>({big}, {}).item<int64_t>(), big);
  EXPECT_EQ(from_vector<int64_t>({std::numeric_limits<int64_t>::min()}, {1}).item<int64_t>(),
            std::numeric_limits<int64_t>::min());
}

TEST(TensorAccess, ItemCastsToTheRequestedType) {
  Tensor b = from_vector<bool>({true}, {});
  EXPECT_EQ(b.item<int>(), 1);
  EXPECT_EQ(b.item<double>(), 1.0);
  EXPECT_EQ(from_vector<uint8_t>({200}, {}).item<int32_t>(), 200);
  EXPECT_EQ(from_vector<double>({-3.75}, {}).item<float>(), -3.75f);
  EXPECT_TRUE(from_vector<float>({0.5f}, {}).item<bool>());
}

TEST(TensorAccess, ElementsOfAStridedViewReadInRowMajorOrder) {
  Tensor m = from_vector<int32_t>({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor t = transpose_raw(m, 0, 1);
  EXPECT_EQ(t.to_vector<int32_t>(), (std::vector<int32_t>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(select_raw(t, 0, 2).to_vector<int64_t>(), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(select_raw(select_raw(t, 0, 1), 0, 1).item<int>(), 4);
}

TEST(TensorAccess, DataChecksTheType) {
  Tensor t = zeros({2});
  EXPECT_NE(t.data<float>(), nullptr);
  EXPECT_ERROR_CONTAINS(t.data<double>(), "data<f64>() on a f32 tensor");
  EXPECT_ERROR_CONTAINS(t.data<int32_t>(), "data<i32>() on a f32 tensor");
}

TEST(TensorAccess, DataPointsAtTheViewsOffset) {
  Tensor t = from_vector<double>({10, 11, 12, 13}, {4});
  Tensor tail = slice_raw(t, 0, 2, 4);
  EXPECT_EQ(tail.offset(), 2);
  EXPECT_EQ(tail.data<double>(), t.data<double>() + 2);
  EXPECT_EQ(*tail.data<double>(), 12.0);
}

TEST(TensorAccess, DimensionArgumentsAreChecked) {
  Tensor t = empty({2, 3});
  EXPECT_ERROR_CONTAINS(t.size(2), "size: dimension 2 out of range for a tensor of shape [2, 3] (valid: -2 to 1)");
  EXPECT_ERROR_CONTAINS(t.stride(-3), "stride: dimension -3 out of range for a tensor of shape [2, 3]");
  EXPECT_EQ(t.wrap_dim(-1), 1);
  EXPECT_ERROR_CONTAINS(t.wrap_dim(5, "sum"), "sum: dimension 5 out of range");
  // A 0-d tensor accepts dim 0 and -1 for reductions, but it has no size or stride to report.
  Tensor s = scalar_tensor(1.0);
  EXPECT_EQ(s.wrap_dim(-1), 0);
  EXPECT_ERROR_CONTAINS(s.size(0), "0-d tensor");
  EXPECT_ERROR_CONTAINS(s.stride(-1), "0-d tensor");
}

TEST(TensorAccess, UndefinedTensor) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_EQ(t.impl(), nullptr);
  EXPECT_ERROR_CONTAINS(t.shape(), "use of an undefined tensor");
  EXPECT_ERROR_CONTAINS(t.numel(), "use of an undefined tensor");
  EXPECT_EQ(to_string(t), "Tensor(undefined)");
}

TEST(TensorAccess, ToStringShowsMetadataAndSmallValues) {
  EXPECT_EQ(to_string(from_vector<float>({1, 0.5f}, {2})), "Tensor(shape=[2], dtype=f32, device=cpu, values=[1, 0.5])");
  EXPECT_EQ(to_string(arange(0, 3), 2), "Tensor(shape=[3], dtype=i64, device=cpu)");
}

TEST(TensorStorage, HandlesShareOneImpl) {
  Tensor a = zeros({3});
  Tensor b = a;
  EXPECT_TRUE(b.is_same(a));
  EXPECT_EQ(a.use_count(), 2);
  b.fill_(2.0);
  EXPECT_EQ(values_of(a), (std::vector<double>{2, 2, 2}));
  Tensor d = a.detach();
  EXPECT_FALSE(d.is_same(a));
  EXPECT_TRUE(d.storage().is_same(a.storage()));
}

TEST(TensorStorage, ViewKeepsStorageAliveAfterBaseIsGone) {
  Tensor view;
  {
    Tensor base = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
    view = select_raw(base, 0, 1);
    EXPECT_TRUE(view.storage().is_same(base.storage()));
    EXPECT_EQ(base.storage().use_count(), 2);
  }
  EXPECT_EQ(view.storage().use_count(), 1);
  EXPECT_EQ(view.storage().nbytes(), 24u);  // the whole base buffer, not just the view's part
  EXPECT_EQ(view.to_vector<float>(), (std::vector<float>{4, 5, 6}));
  view.fill_(9.0);
  EXPECT_EQ(view.to_vector<float>(), (std::vector<float>{9, 9, 9}));
}

TEST(TensorStorage, WrappedMemoryIsReleasedWithTheLastView) {
  std::vector<float> buffer = {1, 2, 3, 4};
  int released = 0;
  void* released_ptr = nullptr;
  {
    Storage storage = Storage::wrap(buffer.data(), buffer.size() * sizeof(float), kCpu, [&](void* p) {
      ++released;
      released_ptr = p;
    });
    Tensor t(std::make_shared<TensorImpl>(storage, Shape{2, 2}, Shape{2, 1}, 0, DType::f32));
    Tensor column = select_raw(t, 1, 1);
    storage = Storage();
    t = Tensor();
    EXPECT_EQ(released, 0);
    EXPECT_EQ(column.to_vector<float>(), (std::vector<float>{2, 4}));
    column.fill_(0.0);
  }
  EXPECT_EQ(released, 1);
  EXPECT_EQ(released_ptr, buffer.data());
  EXPECT_EQ(buffer, (std::vector<float>{1, 0, 3, 0}));
}

TEST(TensorInPlace, FillAndZero) {
  Tensor t = empty({2, 3}, DType::f64);
  EXPECT_TRUE(t.fill_(1.5).is_same(t));
  EXPECT_EQ(values_of(t), (std::vector<double>{1.5, 1.5, 1.5, 1.5, 1.5, 1.5}));
  select_raw(t, 1, 2).fill_(-1.0);  // a strided column: only its elements change
  EXPECT_EQ(values_of(t), (std::vector<double>{1.5, 1.5, -1, 1.5, 1.5, -1}));
  slice_raw(select_raw(t, 0, 0), 0, 0, 3, 2).zero_();
  EXPECT_EQ(values_of(t), (std::vector<double>{0, 1.5, 0, 1.5, 1.5, -1}));
  EXPECT_TRUE(t.zero_().is_same(t));
  EXPECT_EQ(values_of(t), (std::vector<double>{0, 0, 0, 0, 0, 0}));
}

TEST(TensorInPlace, FillCastsTheValue) {
  EXPECT_EQ(values_of(empty({2}, DType::i32).fill_(2.7)), (std::vector<double>{2, 2}));  // truncation
  EXPECT_EQ(values_of(empty({2}, DType::i64).fill_(-2.7)), (std::vector<double>{-2, -2}));
  EXPECT_EQ(values_of(empty({2}, DType::boolean).fill_(0.5)), (std::vector<double>{1, 1}));
  EXPECT_EQ(values_of(empty({2}, DType::boolean).fill_(0.0)), (std::vector<double>{0, 0}));
  // 1/3 in f16 is 1365 * 2^-12 (see dtype_test.cpp).
  EXPECT_EQ(values_of(empty({1}, DType::f16).fill_(1.0 / 3.0)), (std::vector<double>{0.333251953125}));
}

TEST(TensorInPlace, CopyBetweenDtypes) {
  Tensor src = from_vector<double>({1.5, -2.5, 3.75}, {3});
  Tensor i = zeros({3}, DType::i32);
  EXPECT_TRUE(i.copy_(src).is_same(i));
  EXPECT_EQ(i.to_vector<int32_t>(), (std::vector<int32_t>{1, -2, 3}));
  Tensor f = zeros({3}, DType::f32);
  f.copy_(src);
  EXPECT_EQ(f.to_vector<float>(), (std::vector<float>{1.5f, -2.5f, 3.75f}));
  Tensor back = zeros({3}, DType::f64);
  back.copy_(i);
  EXPECT_EQ(values_of(back), (std::vector<double>{1, -2, 3}));
  Tensor h = zeros({3}, DType::bf16);
  h.copy_(src);  // all three are exact in bf16 (at most 4 significant bits)
  EXPECT_EQ(values_of(h), (std::vector<double>{1.5, -2.5, 3.75}));
}

TEST(TensorInPlace, CopyBetweenStridedLayouts) {
  Tensor m = from_vector<float>({0, 1, 2, 3, 4, 5}, {2, 3});
  // Transposed source into a contiguous destination.
  Tensor dst = zeros({3, 2});
  dst.copy_(transpose_raw(m, 0, 1));
  EXPECT_EQ(dst.to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  // Contiguous source into a transposed destination: the base sees the transpose.
  Tensor base = zeros({3, 2}, DType::f64);
  transpose_raw(base, 0, 1).copy_(m);
  EXPECT_EQ(values_of(base), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  // Every other column of a wider destination.
  Tensor wide = zeros({2, 5}, DType::i64);
  slice_raw(wide, 1, 0, 5, 2).copy_(m);
  EXPECT_EQ(values_of(wide), (std::vector<double>{0, 0, 1, 0, 2, 3, 0, 4, 0, 5}));
}

TEST(TensorInPlace, CopyBroadcastsTheSource) {
  Tensor dst = zeros({2, 3});
  dst.copy_(from_vector<float>({7, 8, 9}, {3}));
  EXPECT_EQ(dst.to_vector<float>(), (std::vector<float>{7, 8, 9, 7, 8, 9}));
  dst.copy_(scalar_tensor(-1.0, DType::i64));
  EXPECT_EQ(dst.to_vector<float>(), (std::vector<float>{-1, -1, -1, -1, -1, -1}));
}

TEST(TensorInPlace, CopyRejectsBadSources) {
  Tensor dst = zeros({2, 3});
  EXPECT_ERROR_CONTAINS(dst.copy_(zeros({2})), "shape [2] cannot be broadcast to [2, 3]");
  EXPECT_ERROR_CONTAINS(dst.copy_(zeros({4, 2, 3})), "cannot expand shape [4, 2, 3] to fewer dimensions [2, 3]");
  EXPECT_ERROR_CONTAINS(dst.copy_(Tensor()), "copy_: source tensor is undefined");
}

TEST(TensorAutogradState, SetRequiresGradAndGradChecks) {
  Tensor t = zeros({2, 2}, DType::f64);
  t.set_requires_grad();
  EXPECT_TRUE(t.requires_grad());
  t.set_grad(ones({2, 2}, DType::f64));
  EXPECT_EQ(values_of(t.grad()), (std::vector<double>{1, 1, 1, 1}));
  EXPECT_ERROR_CONTAINS(t.set_grad(ones({4})), "gradient shape [4] does not match the tensor's shape [2, 2]");
  Tensor ints = zeros({2}, DType::i32);
  EXPECT_ERROR_CONTAINS(ints.set_requires_grad(), "only floating tensors can require gradients, got i32");
  EXPECT_NO_THROW(ints.set_requires_grad(false));
}

TEST(Tensor, ElementCountOverflowIsAnError) {
  // 2^33 * 2^33 = 2^66 elements: the count must not wrap to 0 and hand back an empty tensor.
  EXPECT_ERROR_CONTAINS(core::empty({int64_t{1} << 33, int64_t{1} << 33}), "more elements than fit in 64 bits");
}

TEST(Tensor, ByteCountOverflowIsAnErrorNamingTheShapeAndDType) {
  // 2^61 f64 elements fit in int64, their 2^64 bytes do not: a size_t product wraps to 0 bytes and
  // a 0-byte storage would back a tensor claiming 2^61 elements.
  EXPECT_ERROR_CONTAINS(core::empty({int64_t{1} << 61}, DType::f64),
                        "empty: shape [2305843009213693952] of f64 needs 2305843009213693952 elements of 8 bytes, "
                        "more bytes than fit in 64 bits");
  EXPECT_ERROR_CONTAINS(zeros({int64_t{1} << 31, int64_t{1} << 31}, DType::f32),
                        "shape [2147483648, 2147483648] of f32");
  EXPECT_EQ(checked_nbytes({3, 5}, DType::bf16, "t"), 30u);
  EXPECT_EQ(checked_nbytes({}, DType::i64, "t"), 8u);
  EXPECT_EQ(checked_nbytes({4, 0}, DType::f64, "t"), 0u);
}

TEST(Tensor, ZeroSizedShapeWhoseStridesOverflowIsAnError) {
  // No elements, but row-major strides count zero sizes as 1: the first stride would be 2^80.
  const Shape huge = {0, int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_ERROR_CONTAINS(core::empty(huge),
                        "empty: shape [0, 1099511627776, 1099511627776] has no elements, but its "
                        "other sizes multiply past 64 bits");
  // Still fine when the strides fit, with the zero anywhere.
  EXPECT_EQ(core::empty({int64_t{1} << 30, 0, int64_t{1} << 30}).strides(),
            (Shape{int64_t{1} << 30, int64_t{1} << 30, 1}));
  // A view of a tensor without elements goes through the same check.
  const Tensor none = core::empty({0});
  EXPECT_ERROR_CONTAINS(none.view(huge), "view: shape [0, 1099511627776, 1099511627776] has no elements");
  EXPECT_ERROR_CONTAINS(none.view({-1, int64_t{1} << 40, int64_t{1} << 40}),
                        "shape [-1, 1099511627776, 1099511627776] is invalid for a tensor of 0 elements (its sizes "
                        "multiply past 64 bits)");
  EXPECT_EQ(none.view({0, 3, int64_t{1} << 40}).strides(), (Shape{int64_t{3} << 40, int64_t{1} << 40, 1}));
}

}  // namespace
}  // namespace colossal::core
