// cat, stack, split, index_select, gather, scatter_add, where and masked_fill: gradient checks,
// values worked out by hand, broadcast and strided operands, and bad input naming shapes and values.
#include <gtest/gtest.h>

#include "colossal/core/view.h"
#include "gradcheck.h"

namespace colossal {
namespace {

using testing::check_gradients;
using testing::expect_values;
using testing::random_leaf;
using testing::random_tensor;

Tensor i64(const std::vector<int64_t>& values, const Shape& shape) {
  return core::from_vector<int64_t>(values, shape);
}
Tensor f64(const std::vector<double>& values, const Shape& shape) {
  return core::from_vector<double>(values, shape);
}
Tensor mask(const std::vector<bool>& values, const Shape& shape) {
  Tensor m = core::empty(shape, DType::boolean);
  for (size_t i = 0; i < values.size(); ++i) m.data<bool>()[i] = values[i];
  return m;
}

TEST(GradCheck, cat) {
  check_gradients(
      {.make_inputs =
           [] {
             return std::vector<Tensor>{random_leaf({2, 3}, 1), random_leaf({2, 1}, 2), random_leaf({2, 4}, 3)};
           },
       .fn = [](const std::vector<Tensor>& in) { return ops::cat(in, 1); }});
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({1, 3}, 4), random_leaf({2, 3}, 5)};
                       },
                   .fn = [](const std::vector<Tensor>& in) { return ops::cat(in, 0); }});
}

TEST(GradCheck, stack) {
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({2, 3}, 6), random_leaf({2, 3}, 7)};
                       },
                   .fn = [](const std::vector<Tensor>& in) { return ops::stack(in, 1); }});
}

TEST(GradCheck, split) {
  // The parts are weighted differently (different powers), so a gradient routed to the wrong part
  // shows up.
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({5, 2}, 8)};
                       },
                   .fn =
                       [](const std::vector<Tensor>& in) {
                         auto parts = ops::split(in[0], 2, 0);  // sizes 2, 2, 1
                         return ops::cat({parts[0] * parts[0], parts[1] * 3.0, ops::exp(parts[2])}, 0);
                       }});
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({2, 6}, 9)};
                       },
                   .fn =
                       [](const std::vector<Tensor>& in) {
                         auto parts = ops::split(in[0], std::vector<int64_t>{1, 3, 2}, -1);
                         return ops::cat({parts[2], ops::tanh(parts[0]), parts[1] * parts[1]}, 1);
                       }});
}

TEST(GradCheck, index_select) {
  // Index 2 repeats, so the backward must add both contributions.
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({4, 3}, 10), i64({2, 0, 2}, {3})};
                       },
                   .fn = [](const std::vector<Tensor>& in) { return ops::index_select(in[0], 0, in[1]); }});
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({2, 4, 3}, 11), i64({3, 3, 1, 0}, {4})};
                       },
                   .fn = [](const std::vector<Tensor>& in) { return ops::index_select(in[0], 1, in[1]); }});
}

TEST(GradCheck, gather) {
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({3, 4}, 12), i64({0, 0, 3, 1, 2, 2, 2, 0, 3}, {3, 3})};
                       },
                   .fn = [](const std::vector<Tensor>& in) { return ops::gather(in[0], 1, in[1]); }});
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({3, 2}, 13), i64({2, 0, 2, 2}, {2, 2})};
                       },
                   .fn = [](const std::vector<Tensor>& in) { return ops::gather(in[0], 0, in[1]); }});
}

TEST(GradCheck, scatter_add) {
  // src [2, 3] is larger than index [2, 2] along dim 1: its last column gets no gradient.
  check_gradients(
      {.make_inputs =
           [] {
             return std::vector<Tensor>{random_leaf({4, 3}, 14), i64({3, 0, 3, 3}, {2, 2}), random_leaf({2, 3}, 15)};
           },
       .fn = [](const std::vector<Tensor>& in) { return ops::scatter_add(in[0], 0, in[1], in[2]); }});
}

TEST(GradCheck, where) {
  // condition [3, 1] broadcasts against a [3, 4] and b [4].
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{mask({true, false, true}, {3, 1}), random_leaf({3, 4}, 16),
                                                    random_leaf({4}, 17)};
                       },
                   .fn = [](const std::vector<Tensor>& in) { return ops::where(in[0], in[1], in[2]); }});
}

TEST(GradCheck, masked_fill) {
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({2, 3}, 18), mask({false, true, false}, {3})};
                       },
                   .fn = [](const std::vector<Tensor>& in) { return ops::masked_fill(in[0], in[1], 7.5); }});
}

TEST(Indexing, CatValues) {
  Tensor a = f64({1, 2, 3, 4}, {2, 2});
  Tensor b = f64({5, 6}, {2, 1});
  expect_values(ops::cat({a, b}, 1), {1, 2, 5, 3, 4, 6});
  expect_values(ops::cat({a, a.t()}, 0), {1, 2, 3, 4, 1, 3, 2, 4});  // strided input
  expect_values(ops::cat({a, core::empty({0, 2}, DType::f64)}, 0), {1, 2, 3, 4});
  EXPECT_EQ(ops::cat({b, b, b}, -1).shape(), (Shape{2, 3}));
}

TEST(Indexing, StackValues) {
  Tensor a = f64({1, 2}, {2});
  Tensor b = f64({3, 4}, {2});
  Tensor s0 = ops::stack({a, b}, 0);
  EXPECT_EQ(s0.shape(), (Shape{2, 2}));
  expect_values(s0, {1, 2, 3, 4});
  expect_values(ops::stack({a, b}, -1), {1, 3, 2, 4});
}

TEST(Indexing, SplitReturnsViews) {
  Tensor a = f64({0, 1, 2, 3, 4, 5, 6}, {7});
  auto parts = ops::split(a, 3);
  ASSERT_EQ(parts.size(), 3u);
  expect_values(parts[0], {0, 1, 2});
  expect_values(parts[2], {6});
  parts[1].fill_(9.0);  // a view: the write shows in a
  expect_values(a, {0, 1, 2, 9, 9, 9, 6});
  auto sized = ops::split(a, std::vector<int64_t>{0, 7});
  EXPECT_EQ(sized[0].numel(), 0);
  EXPECT_EQ(sized[1].numel(), 7);
}

TEST(Indexing, IndexSelectValues) {
  Tensor a = f64({1, 2, 3, 4, 5, 6}, {2, 3});
  expect_values(ops::index_select(a, 1, i64({2, 0}, {2})), {3, 1, 6, 4});
  expect_values(ops::index_select(a, 0, core::from_vector<int32_t>({1, 1, 0}, {3})), {4, 5, 6, 4, 5, 6, 1, 2, 3});
  expect_values(ops::index_select(a.t(), 0, i64({1}, {1})), {2, 5});  // strided input
  EXPECT_EQ(ops::index_select(a, 0, i64({}, {0})).shape(), (Shape{0, 3}));
}

TEST(Indexing, GatherValues) {
  // out[i][j] = a[i][index[i][j]]
  Tensor a = f64({1, 2, 3, 4}, {2, 2});
  expect_values(ops::gather(a, 1, i64({0, 0, 1, 0}, {2, 2})), {1, 1, 4, 3});
  // dim 0: out[i][j] = a[index[i][j]][j]; index smaller than a in dim 1 is allowed.
  expect_values(ops::gather(a, 0, i64({1, 0, 1}, {3, 1})), {3, 1, 3});
}

TEST(Indexing, ScatterAddValues) {
  Tensor a = core::zeros({3}, DType::f64);
  expect_values(ops::scatter_add(a, 0, i64({0, 2, 0}, {3}), f64({1, 2, 3}, {3})), {4, 0, 2});
  expect_values(a, {0, 0, 0});  // the input is not modified
  Tensor b = f64({1, 1, 1, 1}, {2, 2});
  expect_values(ops::scatter_add(b, 1, i64({1, 1, 0, 1}, {2, 2}), f64({10, 20, 30, 40}, {2, 2})), {1, 31, 31, 41});
}

TEST(Indexing, ScatterAddIsDeterministicForLargeInputs) {
  // Many collisions per column on a large tensor: every thread count gives the same bits.
  Tensor src = random_tensor({4096, 64}, 20, -1, 1, DType::f32);
  Tensor index = core::empty({4096, 64}, DType::i64);
  for (int64_t i = 0; i < index.numel(); ++i) index.data<int64_t>()[i] = (i * 7919) % 5;
  Tensor out1 = ops::scatter_add(core::zeros({5, 64}, DType::f32), 0, index, src);
  Tensor out2 = ops::scatter_add(core::zeros({5, 64}, DType::f32), 0, index, src);
  testing::expect_close(out1, out2, 0, 0);
}

TEST(Indexing, WhereAndMaskedFillValues) {
  Tensor c = mask({true, false, false, true}, {2, 2});
  expect_values(ops::where(c, f64({1, 2, 3, 4}, {2, 2}), f64({-1}, {1})), {1, -1, -1, 4});
  expect_values(ops::masked_fill(f64({1, 2, 3, 4}, {2, 2}), mask({false, true}, {2}), -5), {1, -5, 3, -5});
  Tensor ints = core::from_vector<int32_t>({1, 2}, {2});
  Tensor picked = ops::where(mask({false, true}, {2}), ints, core::from_vector<int32_t>({7, 8}, {2}));
  EXPECT_EQ(picked.data<int32_t>()[0], 7);
  EXPECT_EQ(picked.data<int32_t>()[1], 2);
}

TEST(Indexing, BadInputNamesShapesAndValues) {
  Tensor a = f64({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_ERROR_CONTAINS(ops::cat({a, f64({1, 2}, {2, 1, 1})}, 0), "[2, 3], [2, 1, 1]");
  EXPECT_ERROR_CONTAINS(ops::cat({a, core::zeros({3, 3}, DType::f64)}, 1), "differ outside dim 1");
  EXPECT_ERROR_CONTAINS(ops::cat({a, core::zeros({2, 3}, DType::f32)}, 0), "tensor 1 is f32");
  EXPECT_ERROR_CONTAINS(ops::stack({a, a.t()}, 0), "tensor 1 is [3, 2]");
  EXPECT_ERROR_CONTAINS(ops::split(a, std::vector<int64_t>{1, 1}, 1), "add up to 2 but shape [2, 3] has 3");
  EXPECT_ERROR_CONTAINS(ops::index_select(a, 1, i64({0, 3}, {2})),
                        "index_select: index 3 at position [1] of index [2]");
  EXPECT_ERROR_CONTAINS(ops::index_select(a, 1, i64({-1}, {1})), "valid: 0..2");
  EXPECT_ERROR_CONTAINS(ops::index_select(a, 0, f64({0}, {1})), "must be i64 or i32, got f64");
  EXPECT_ERROR_CONTAINS(ops::gather(a, 0, i64({0, 1}, {2})), "index [2] must have the rank of input [2, 3]");
  EXPECT_ERROR_CONTAINS(ops::gather(a, 0, i64({0, 0, 0, 0}, {1, 4})), "larger than input [2, 3] in dim 1");
  EXPECT_ERROR_CONTAINS(ops::gather(a, 1, i64({0, 5}, {1, 2})), "index 5 at position [0, 1]");
  EXPECT_ERROR_CONTAINS(ops::scatter_add(a, 0, i64({2}, {1, 1}), f64({1}, {1, 1})), "index 2 at position [0, 0]");
  EXPECT_ERROR_CONTAINS(ops::where(mask({true}, {1}), a, core::zeros({3}, DType::f32)), "b is f32");
  EXPECT_ERROR_CONTAINS(ops::where(f64({1}, {1}), a, a), "condition must be bool");
  EXPECT_ERROR_CONTAINS(ops::masked_fill(a, mask({true, false}, {2}), 0), "[2]");
  EXPECT_ERROR_CONTAINS(
      ops::masked_fill(core::zeros({3}, DType::f64), mask({true, false, true, false, true, false}, {2, 3}), 0),
      "mask [2, 3] must broadcast to the input's shape [3]");
}

}  // namespace
}  // namespace colossal
