// The raw view primitives of core/view.h: each view's shape, strides, offset and values, that views
// share storage with their base (writes go through), broadcasting rules, contiguous copies of
// strided layouts, and the errors that name the offending shapes.
#include <gtest/gtest.h>

#include <vector>

#include "colossal/core/tensor.h"
#include "colossal/core/view.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::core {
namespace {

/// 0, 1, 2, ... laid out row-major in `shape`, as f32 (exact for these small integers).
Tensor iota(const Shape& shape) {
  return view_raw(arange(0, static_cast<double>(shape_numel(shape)), 1, DType::f32), shape);
}

std::vector<float> values_of(const Tensor& t) {
  return t.to_vector<float>();
}

TEST(View, ContiguousViewSharesStorage) {
  Tensor x = iota({2, 3, 4});
  Tensor v = view_raw(x, {6, 4});
  EXPECT_EQ(v.shape(), (Shape{6, 4}));
  EXPECT_EQ(v.strides(), (Shape{4, 1}));
  EXPECT_TRUE(v.storage().is_same(x.storage()));
  EXPECT_EQ(values_of(v), values_of(x));
  EXPECT_EQ(view_raw(x, {4, -1}).shape(), (Shape{4, 6}));
  EXPECT_EQ(view_raw(x, {-1}).shape(), Shape{24});
  Tensor s = view_raw(iota({1}), {});
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(view_raw(s, {1, 1, 1}).shape(), (Shape{1, 1, 1}));
}

TEST(View, InferShape) {
  EXPECT_EQ(infer_shape({-1, 4}, 12), (Shape{3, 4}));
  EXPECT_EQ(infer_shape({2, -1, 3}, 0), (Shape{2, 0, 3}));
  EXPECT_ERROR_CONTAINS(infer_shape({5, -1}, 24), "shape [5, -1] is invalid for a tensor of 24 elements");
  EXPECT_ERROR_CONTAINS(infer_shape({7}, 24), "shape [7] is invalid for a tensor of 24 elements");
  EXPECT_ERROR_CONTAINS(infer_shape({-1, -1}, 4), "shape [-1, -1]: only one dimension can be -1");
  EXPECT_ERROR_CONTAINS(infer_shape({2, -3}, 6), "shape [2, -3]: sizes must be >= 0 or -1");
  // With a 0 among the known sizes, -1 could be anything.
  EXPECT_ERROR_CONTAINS(infer_shape({0, -1}, 0), "shape [0, -1] is invalid for a tensor of 0 elements");
}

TEST(View, NonContiguousViewFailsClearly) {
  Tensor t = transpose_raw(iota({4, 6}), 0, 1);
  EXPECT_FALSE(try_view(t, {24}).defined());
  EXPECT_ERROR_CONTAINS(view_raw(t, {24}),
                        "view: cannot view a tensor of shape [6, 4] and strides [1, 6] as [24] without copying; use "
                        "reshape()");
  // The shape error comes first when the element count is wrong, from try_view too.
  EXPECT_ERROR_CONTAINS(try_view(t, {5, 5}), "shape [5, 5] is invalid for a tensor of 24 elements");
}

TEST(View, NonContiguousViewWithinCompatibleDims) {
  // Transposing dims 0 and 1 leaves the last dimension dense: it can still be split, but not
  // merged with dimension 1.
  Tensor t = transpose_raw(iota({2, 3, 4}), 0, 1);  // shape [3, 2, 4], strides [4, 12, 1]
  Tensor split = try_view(t, {3, 2, 2, 2});
  ASSERT_TRUE(split.defined());
  EXPECT_EQ(split.strides(), (Shape{4, 12, 2, 1}));
  EXPECT_EQ(values_of(split), values_of(t));
  EXPECT_FALSE(try_view(t, {3, 8}).defined());
  EXPECT_FALSE(try_view(t, {6, 4}).defined());

  // Dropping columns keeps each row dense: rows can be regrouped, columns not merged with rows.
  Tensor s = slice_raw(iota({4, 6}), 1, 0, 3);  // shape [4, 3], strides [6, 1]
  Tensor grouped = view_raw(s, {2, 2, 3});
  EXPECT_EQ(grouped.strides(), (Shape{12, 6, 1}));
  EXPECT_EQ(values_of(grouped), (std::vector<float>{0, 1, 2, 6, 7, 8, 12, 13, 14, 18, 19, 20}));
  EXPECT_FALSE(try_view(s, {12}).defined());
}

TEST(Permute, ReordersShapeAndStrides) {
  Tensor x = iota({2, 3, 4});
  Tensor p = permute_raw(x, {2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Shape{1, 12, 4}));
  EXPECT_EQ(p.offset(), 0);
  EXPECT_FALSE(p.is_contiguous());
  EXPECT_TRUE(p.storage().is_same(x.storage()));
  // p[k][i][j] = x[i][j][k] = 12i + 4j + k.
  EXPECT_EQ(values_of(p),
            (std::vector<float>{0, 4, 8, 12, 16, 20, 1, 5, 9, 13, 17, 21, 2, 6, 10, 14, 18, 22, 3, 7, 11, 15, 19, 23}));
  EXPECT_EQ(permute_raw(x, {-1, 0, 1}).strides(), (Shape{1, 12, 4}));
  EXPECT_TRUE(permute_raw(x, {0, 1, 2}).is_contiguous());
}

TEST(Permute, RejectsBadDims) {
  Tensor x = iota({2, 3, 4});
  EXPECT_ERROR_CONTAINS(permute_raw(x, {0, 1}), "permute: 2 dims given for a tensor of shape [2, 3, 4]");
  EXPECT_ERROR_CONTAINS(permute_raw(x, {0, 0, 1}), "permute: dimension 0 repeats in [0, 0, 1]");
  EXPECT_ERROR_CONTAINS(permute_raw(x, {0, 1, 3}),
                        "permute: dimension 3 out of range for a tensor of shape [2, 3, 4] (valid: -3 to 2)");
}

TEST(Transpose, SwapsTwoDims) {
  Tensor m = iota({2, 3});
  Tensor t = transpose_raw(m, 0, 1);
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_EQ(t.strides(), (Shape{1, 3}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_TRUE(t.storage().is_same(m.storage()));
  EXPECT_EQ(values_of(t), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(transpose_raw(m, -1, -2).strides(), (Shape{1, 3}));
  EXPECT_TRUE(transpose_raw(t, 0, 1).is_contiguous());
  EXPECT_EQ(transpose_raw(scalar_tensor(2.0), 0, 0).item<double>(), 2.0);
  EXPECT_ERROR_CONTAINS(transpose_raw(m, 0, 2), "transpose: dimension 2 out of range for a tensor of shape [2, 3]");
}

TEST(Slice, StepOffsetAndClamping) {
  Tensor v = iota({10});
  Tensor s = slice_raw(v, 0, 1, 8, 3);
  EXPECT_EQ(s.shape(), Shape{3});
  EXPECT_EQ(s.strides(), Shape{3});
  EXPECT_EQ(s.offset(), 1);
  EXPECT_EQ(values_of(s), (std::vector<float>{1, 4, 7}));
  EXPECT_EQ(values_of(slice_raw(v, 0, 0, 10, 5)), (std::vector<float>{0, 5}));
  // Negative bounds count from the end; out-of-range bounds clamp like Python slices.
  EXPECT_EQ(values_of(slice_raw(v, 0, -3, 1000)), (std::vector<float>{7, 8, 9}));
  EXPECT_EQ(values_of(slice_raw(v, 0, -100, 2)), (std::vector<float>{0, 1}));
  EXPECT_EQ(values_of(slice_raw(v, 0, 2, -7)), (std::vector<float>{2}));
  EXPECT_EQ(slice_raw(v, 0, 5, 2).shape(), Shape{0});
  EXPECT_EQ(slice_raw(v, 0, 20, 30).shape(), Shape{0});
}

TEST(Slice, AlongAnInnerDim) {
  Tensor m = iota({2, 3});
  Tensor s = slice_raw(m, 1, 0, 3, 2);
  EXPECT_EQ(s.shape(), (Shape{2, 2}));
  EXPECT_EQ(s.strides(), (Shape{3, 2}));
  EXPECT_EQ(values_of(s), (std::vector<float>{0, 2, 3, 5}));
  EXPECT_EQ(values_of(slice_raw(m, -1, 1, 3)), (std::vector<float>{1, 2, 4, 5}));
}

TEST(Slice, RejectsBadArguments) {
  Tensor v = iota({4});
  EXPECT_ERROR_CONTAINS(slice_raw(v, 0, 0, 4, 0), "slice: step must be positive, got 0");
  EXPECT_ERROR_CONTAINS(slice_raw(v, 0, 0, 4, -1), "slice: step must be positive, got -1");
  EXPECT_ERROR_CONTAINS(slice_raw(scalar_tensor(1.0), 0, 0, 1), "slice: cannot slice a 0-d tensor");
  EXPECT_ERROR_CONTAINS(slice_raw(v, 1, 0, 1), "slice: dimension 1 out of range for a tensor of shape [4]");
}

TEST(Narrow, TakesALengthFromAStart) {
  Tensor m = iota({2, 3});
  Tensor n = narrow_raw(m, 1, 1, 2);
  EXPECT_EQ(n.shape(), (Shape{2, 2}));
  EXPECT_EQ(n.strides(), (Shape{3, 1}));
  EXPECT_EQ(n.offset(), 1);
  EXPECT_EQ(values_of(n), (std::vector<float>{1, 2, 4, 5}));
  EXPECT_EQ(values_of(narrow_raw(m, -2, 1, 1)), (std::vector<float>{3, 4, 5}));
  EXPECT_EQ(narrow_raw(m, 1, 3, 0).shape(), (Shape{2, 0}));
  EXPECT_ERROR_CONTAINS(narrow_raw(m, 1, 2, 2),
                        "narrow: [2, 4) is out of range for dimension 1 of size 3 (shape [2, 3])");
  EXPECT_ERROR_CONTAINS(narrow_raw(m, 0, -1, 1), "narrow: [-1, 0) is out of range for dimension 0 of size 2");
  EXPECT_ERROR_CONTAINS(narrow_raw(scalar_tensor(1.0), 0, 0, 1), "narrow: cannot narrow a 0-d tensor");
}

TEST(Select, DropsADimAndCountsNegativeIndicesFromTheEnd) {
  Tensor m = iota({2, 3});
  Tensor row = select_raw(m, 0, -1);
  EXPECT_EQ(row.shape(), Shape{3});
  EXPECT_EQ(row.strides(), Shape{1});
  EXPECT_EQ(row.offset(), 3);
  EXPECT_EQ(values_of(row), (std::vector<float>{3, 4, 5}));
  Tensor column = select_raw(m, 1, -3);
  EXPECT_EQ(column.strides(), Shape{3});
  EXPECT_EQ(values_of(column), (std::vector<float>{0, 3}));
  Tensor element = select_raw(row, 0, 1);
  EXPECT_EQ(element.dim(), 0);
  EXPECT_EQ(element.offset(), 4);
  EXPECT_EQ(element.item<float>(), 4.0f);
}

TEST(Select, RejectsBadIndices) {
  Tensor m = iota({2, 3});
  EXPECT_ERROR_CONTAINS(select_raw(m, 0, 2), "select: index 2 is out of range for dimension 0 of size 2");
  EXPECT_ERROR_CONTAINS(select_raw(m, 1, -4), "select: index -4 is out of range for dimension 1 of size 3");
  EXPECT_ERROR_CONTAINS(select_raw(m, 2, 0), "select: dimension 2 out of range for a tensor of shape [2, 3]");
  EXPECT_ERROR_CONTAINS(select_raw(scalar_tensor(1.0), 0, 0), "select: cannot select from a 0-d tensor");
}

TEST(Unsqueeze, InsertsASizeOneDim) {
  Tensor m = iota({2, 3});
  EXPECT_EQ(unsqueeze_raw(m, 0).shape(), (Shape{1, 2, 3}));
  EXPECT_EQ(unsqueeze_raw(m, 0).strides(), (Shape{6, 3, 1}));
  EXPECT_EQ(unsqueeze_raw(m, 1).shape(), (Shape{2, 1, 3}));
  EXPECT_EQ(unsqueeze_raw(m, 1).strides(), (Shape{3, 3, 1}));
  EXPECT_EQ(unsqueeze_raw(m, -1).shape(), (Shape{2, 3, 1}));
  EXPECT_EQ(unsqueeze_raw(m, -1).strides(), (Shape{3, 1, 1}));
  EXPECT_TRUE(unsqueeze_raw(m, 2).is_contiguous());
  EXPECT_EQ(values_of(unsqueeze_raw(m, 1)), values_of(m));
  EXPECT_EQ(unsqueeze_raw(scalar_tensor(1.0), -1).shape(), Shape{1});
  EXPECT_ERROR_CONTAINS(unsqueeze_raw(m, 3), "unsqueeze: dimension 3 out of range for shape [2, 3] (valid: -3 to 2)");
  EXPECT_ERROR_CONTAINS(unsqueeze_raw(m, -4), "unsqueeze: dimension -4 out of range");
}

TEST(Squeeze, RemovesOnlyASizeOneDim) {
  Tensor x = iota({2, 1, 3});
  EXPECT_EQ(squeeze_raw(x, 1).shape(), (Shape{2, 3}));
  EXPECT_EQ(squeeze_raw(x, 1).strides(), (Shape{3, 1}));
  EXPECT_EQ(squeeze_raw(x, -2).shape(), (Shape{2, 3}));
  // A dimension that is not 1 stays; the result is still a new view of the same storage.
  Tensor same = squeeze_raw(x, 0);
  EXPECT_EQ(same.shape(), (Shape{2, 1, 3}));
  EXPECT_FALSE(same.is_same(x));
  EXPECT_TRUE(same.storage().is_same(x.storage()));
  EXPECT_EQ(squeeze_raw(scalar_tensor(1.0), 0).shape(), Shape{});
  EXPECT_ERROR_CONTAINS(squeeze_raw(x, 3), "squeeze: dimension 3 out of range for a tensor of shape [2, 1, 3]");
}

TEST(Expand, SizeOneDimsGetStrideZero) {
  Tensor column = view_raw(from_vector<float>({1, 2, 3}, {3}), {3, 1});
  Tensor e = expand_raw(column, {3, 4});
  EXPECT_EQ(e.shape(), (Shape{3, 4}));
  EXPECT_EQ(e.strides(), (Shape{1, 0}));
  EXPECT_TRUE(e.storage().is_same(column.storage()));
  EXPECT_EQ(values_of(e), (std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3}));
  EXPECT_EQ(expand_raw(column, {-1, 2}).shape(), (Shape{3, 2}));
  EXPECT_EQ(expand_raw(column, {3, 0}).shape(), (Shape{3, 0}));
  EXPECT_EQ(expand_raw(column, {3, 1}).strides(), (Shape{1, 1}));
}

TEST(Expand, NewLeadingDims) {
  Tensor row = from_vector<float>({1, 2, 3}, {3});
  Tensor e = expand_raw(row, {2, 3});
  EXPECT_EQ(e.strides(), (Shape{0, 1}));
  EXPECT_EQ(values_of(e), (std::vector<float>{1, 2, 3, 1, 2, 3}));
  EXPECT_EQ(expand_raw(row, {2, -1}).shape(), (Shape{2, 3}));
  EXPECT_EQ(expand_raw(row, {0, 3}).numel(), 0);
  Tensor s = expand_raw(scalar_tensor(5.0), {2, 2});
  EXPECT_EQ(s.strides(), (Shape{0, 0}));
  EXPECT_EQ(values_of(s), (std::vector<float>{5, 5, 5, 5}));
}

TEST(Expand, InvalidExpandNamesTheShapes) {
  Tensor column = iota({3, 1});
  EXPECT_ERROR_CONTAINS(expand_raw(column, {4, 4}),
                        "expand: shape [3, 1] cannot be broadcast to [4, 4] (dimension 0 has size 3, not 1)");
  EXPECT_ERROR_CONTAINS(expand_raw(column, {3}), "expand: cannot expand shape [3, 1] to fewer dimensions [3]");
  EXPECT_ERROR_CONTAINS(expand_raw(column, {-1, 3, 1}),
                        "expand: size -1 is not allowed for a new leading dimension in [-1, 3, 1]");
}

TEST(BroadcastShapes, NumPyRules) {
  EXPECT_EQ(broadcast_shapes({}, {}), Shape{});
  EXPECT_EQ(broadcast_shapes({}, {2, 3}), (Shape{2, 3}));
  EXPECT_EQ(broadcast_shapes({2, 3}, {}), (Shape{2, 3}));
  EXPECT_EQ(broadcast_shapes({3, 1}, {1, 4}), (Shape{3, 4}));
  EXPECT_EQ(broadcast_shapes({5, 1, 4}, {3, 1}), (Shape{5, 3, 4}));
  EXPECT_EQ(broadcast_shapes({1}, {1, 1, 1}), (Shape{1, 1, 1}));
}

TEST(BroadcastShapes, ZeroSizeDims) {
  // 0 behaves like any other size: it broadcasts against 1 and matches only itself otherwise.
  EXPECT_EQ(broadcast_shapes({0}, {1}), Shape{0});
  EXPECT_EQ(broadcast_shapes({1}, {0}), Shape{0});
  EXPECT_EQ(broadcast_shapes({2, 0}, {2, 1}), (Shape{2, 0}));
  EXPECT_EQ(broadcast_shapes({0}, {}), Shape{0});
  EXPECT_ERROR_CONTAINS(broadcast_shapes({0}, {3}),
                        "broadcast: shapes [0] and [3] cannot be broadcast together (dimension 0: 0 vs 3)");
}

TEST(BroadcastShapes, IncompatibleShapesNameBothAndTheOp) {
  EXPECT_ERROR_CONTAINS(broadcast_shapes({2, 3}, {3, 2}, "add"),
                        "add: shapes [2, 3] and [3, 2] cannot be broadcast together (dimension 0: 2 vs 3)");
  // The dimension is counted in the (right-aligned) result.
  EXPECT_ERROR_CONTAINS(broadcast_shapes({2, 1, 4}, {3, 5}),
                        "shapes [2, 1, 4] and [3, 5] cannot be broadcast together (dimension 2: 4 vs 5)");
}

TEST(Contiguous, ReturnsTheTensorItselfWhenAlreadyContiguous) {
  Tensor x = iota({2, 3});
  EXPECT_TRUE(contiguous_raw(x).is_same(x));
  EXPECT_TRUE(contiguous_raw(unsqueeze_raw(x, 0)).storage().is_same(x.storage()));
}

TEST(Contiguous, CopiesPermutedSlicedAndExpanded) {
  Tensor x = iota({2, 3, 4});
  Tensor p = contiguous_raw(permute_raw(x, {2, 0, 1}));
  EXPECT_TRUE(p.is_contiguous());
  EXPECT_EQ(p.strides(), (Shape{6, 3, 1}));
  EXPECT_FALSE(p.storage().is_same(x.storage()));
  EXPECT_EQ(values_of(p),
            (std::vector<float>{0, 4, 8, 12, 16, 20, 1, 5, 9, 13, 17, 21, 2, 6, 10, 14, 18, 22, 3, 7, 11, 15, 19, 23}));

  Tensor s = contiguous_raw(slice_raw(x, 2, 1, 4, 2));  // odd last indices
  EXPECT_EQ(s.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(s.strides(), (Shape{6, 2, 1}));
  EXPECT_EQ(s.offset(), 0);
  EXPECT_EQ(values_of(s), (std::vector<float>{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23}));

  Tensor e = contiguous_raw(expand_raw(iota({3, 1}), {2, 3, 2}));
  EXPECT_EQ(e.strides(), (Shape{6, 2, 1}));
  EXPECT_EQ(values_of(e), (std::vector<float>{0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2}));
  // The copy is independent of the base.
  x.fill_(-1.0);
  EXPECT_EQ(values_of(s)[0], 1.0f);
}

TEST(ZeroSize, ZeroSizeTensorsViewLikeAnyOther) {
  Tensor t = empty({3, 0});
  Tensor v = view_raw(t, {0, 3});
  EXPECT_EQ(v.shape(), (Shape{0, 3}));
  EXPECT_EQ(view_raw(transpose_raw(t, 0, 1), {-1}).shape(), Shape{0});
  EXPECT_EQ(contiguous_raw(transpose_raw(empty({2, 0, 3}), 0, 2)).shape(), (Shape{3, 0, 2}));
}

TEST(WritesThroughViews, AreVisibleInTheBase) {
  Tensor m = iota({2, 3});
  select_raw(m, 0, 1).fill_(7.0);
  EXPECT_EQ(values_of(m), (std::vector<float>{0, 1, 2, 7, 7, 7}));
  select_raw(transpose_raw(m, 0, 1), 0, 0).copy_(from_vector<float>({10, 20}, {2}));
  EXPECT_EQ(values_of(m), (std::vector<float>{10, 1, 2, 20, 7, 7}));
  slice_raw(view_raw(m, {6}), 0, 1, 6, 2).zero_();
  EXPECT_EQ(values_of(m), (std::vector<float>{10, 0, 2, 0, 7, 0}));
  narrow_raw(squeeze_raw(unsqueeze_raw(m, 0), 0), 1, 2, 1).fill_(-3.0);
  EXPECT_EQ(values_of(m), (std::vector<float>{10, 0, -3, 0, 7, -3}));
}

TEST(AsStrided, ArbitraryLayoutsOverTheStorage) {
  Tensor sq = iota({3, 3});
  Tensor diagonal = as_strided(sq, {3}, {4}, 0);
  EXPECT_EQ(values_of(diagonal), (std::vector<float>{0, 4, 8}));
  diagonal.fill_(-1.0);
  EXPECT_EQ(values_of(sq), (std::vector<float>{-1, 1, 2, 3, -1, 5, 6, 7, -1}));
  // Overlapping sliding windows.
  Tensor windows = as_strided(iota({6}), {3, 3}, {1, 1}, 1);
  EXPECT_EQ(values_of(windows), (std::vector<float>{1, 2, 3, 2, 3, 4, 3, 4, 5}));
  // The offset is absolute in the storage, not relative to a view's own offset.
  Tensor m = iota({2, 3});
  EXPECT_EQ(values_of(as_strided(select_raw(m, 0, 1), {2}, {1}, 0)), (std::vector<float>{0, 1}));
  EXPECT_EQ(as_strided(m, {0, 7}, {100, 100}, 50).numel(), 0);  // nothing is reached
}

TEST(AsStrided, RejectsViewsOutsideTheStorage) {
  Tensor v = iota({6});
  EXPECT_ERROR_CONTAINS(as_strided(v, {3, 3}, {1, 1}, 4),
                        "as_strided: view (shape [3, 3], strides [1, 1], offset 4) reaches element 8 of a storage of 6 "
                        "elements");
  EXPECT_ERROR_CONTAINS(as_strided(v, {3}, {1, 1}, 0), "as_strided: shape [3] and strides [1, 1] differ in rank");
  EXPECT_ERROR_CONTAINS(as_strided(v, {-1}, {1}, 0), "as_strided: negative size in shape [-1]");
}

TEST(Accumulate, AddsInPlace) {
  Tensor dst = from_vector<float>({1, 2, 3, 4}, {2, 2});
  accumulate_(dst, from_vector<float>({10, 20, 30, 40}, {2, 2}));
  EXPECT_EQ(values_of(dst), (std::vector<float>{11, 22, 33, 44}));
  accumulate_(transpose_raw(dst, 0, 1), from_vector<float>({1, 2, 3, 4}, {2, 2}));
  EXPECT_EQ(values_of(dst), (std::vector<float>{12, 25, 35, 48}));
  EXPECT_ERROR_CONTAINS(accumulate_(dst, zeros({4})),
                        "accumulate: destination (shape [2, 2], f32, cpu) and source (shape [4], f32, cpu) must match");
  EXPECT_ERROR_CONTAINS(accumulate_(dst, zeros({2, 2}, DType::f64)), "source (shape [2, 2], f64, cpu)");
}

TEST(AccumulateMany, AddsEveryPairAsAccumulateDoes) {
  // A strided destination and one of f64 beside f32 ones; an empty pair.
  Tensor a = from_vector<float>({1, 2, 3, 4}, {2, 2});
  Tensor b = from_vector<double>({0.5, 0.25}, {2});
  Tensor c = from_vector<float>({1, 2, 3, 4}, {2, 2});
  accumulate_many_({a, b, transpose_raw(c, 0, 1), zeros({0})},
                   {from_vector<float>({10, 20, 30, 40}, {2, 2}), from_vector<double>({1, 2}, {2}),
                    from_vector<float>({1, 2, 3, 4}, {2, 2}), zeros({0})});
  EXPECT_EQ(values_of(a), (std::vector<float>{11, 22, 33, 44}));
  EXPECT_EQ(b.to_vector<double>(), (std::vector<double>{1.5, 2.25}));
  EXPECT_EQ(values_of(c), (std::vector<float>{2, 5, 5, 8}));
  EXPECT_ERROR_CONTAINS(accumulate_many_({a}, {}), "accumulate_many: 1 destinations and 0 sources");
  EXPECT_ERROR_CONTAINS(accumulate_many_({a, b}, {zeros({2, 2}), zeros({3})}),
                        "accumulate_many: pair 1: destination (shape [2], f64, cpu) and source (shape [3], f32, cpu)");
  // Two additions into one tensor would race on a device: refused before anything is added.
  EXPECT_ERROR_CONTAINS(accumulate_many_({a, a}, {zeros({2, 2}), zeros({2, 2})}), "two destinations are the same");
  EXPECT_EQ(values_of(a), (std::vector<float>{11, 22, 33, 44}));
}

}  // namespace
}  // namespace colossal::core
