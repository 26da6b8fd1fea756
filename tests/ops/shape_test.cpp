// Differentiable views: every view op's gradient by finite differences, and that a view shares
// storage while reshape of a non-viewable tensor copies.
#include <gtest/gtest.h>

#include "gradcheck.h"

namespace colossal {
namespace {

using testing::check_gradients;
using testing::expect_values;
using testing::random_leaf;

void check_view(const std::function<Tensor(const Tensor&)>& op) {
  check_gradients({.make_inputs = [] { return std::vector<Tensor>{random_leaf({2, 3, 4}, 41)}; },
                   .fn = [=](const std::vector<Tensor>& in) { return op(in[0]); }});
}

// Each view is followed by a multiplication with a fixed pattern so gradients differ per element.
TEST(GradCheck, view) { check_view([](const Tensor& x) { return x.view({6, 4}); }); }
TEST(GradCheck, reshape) { check_view([](const Tensor& x) { return x.transpose(0, 2).reshape({4, -1}); }); }
TEST(GradCheck, permute) { check_view([](const Tensor& x) { return x.permute({2, 0, 1}); }); }
TEST(GradCheck, transpose) { check_view([](const Tensor& x) { return x.transpose(1, 2); }); }
TEST(GradCheck, slice) { check_view([](const Tensor& x) { return x.slice(2, 1, 4, 2); }); }
TEST(GradCheck, narrow) { check_view([](const Tensor& x) { return x.narrow(1, 1, 2); }); }
TEST(GradCheck, select) { check_view([](const Tensor& x) { return x.select(0, 1); }); }
TEST(GradCheck, unsqueeze) { check_view([](const Tensor& x) { return x.unsqueeze(1); }); }
TEST(GradCheck, squeeze) { check_view([](const Tensor& x) { return x.narrow(0, 0, 1).squeeze(0); }); }
TEST(GradCheck, flatten) { check_view([](const Tensor& x) { return x.flatten(1); }); }
TEST(GradCheck, expand) { check_view([](const Tensor& x) { return x.narrow(1, 0, 1).expand({3, 2, 5, 4}); }); }
TEST(GradCheck, contiguous) { check_view([](const Tensor& x) { return x.transpose(0, 1).contiguous(); }); }
TEST(GradCheck, clone) { check_view([](const Tensor& x) { return x.clone() * x; }); }
TEST(GradCheck, to_dtype) {
  // The round trip through f32 rounds each value by up to 2^-24 relative, so the finite difference
  // carries an error of ~1e-7 / eps: eps 1e-2 keeps it near 1e-5 (the op is linear, so a large eps
  // adds no truncation error); atol 1e-4 covers that with margin.
  check_gradients({.make_inputs = [] { return std::vector<Tensor>{random_leaf({2, 3, 4}, 41)}; },
                   .fn = [](const std::vector<Tensor>& in) { return in[0].to(DType::f32).to(DType::f64) * 2.0; },
                   .eps = 1e-2,
                   .atol = 1e-4});
}

TEST(ShapeOps, ViewsShareStorageReshapeCopiesWhenNeeded) {
  Tensor x = core::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor v = x.view({3, 2});
  EXPECT_TRUE(v.storage().is_same(x.storage()));
  Tensor t = x.t();
  EXPECT_FALSE(t.is_contiguous());
  Tensor r = t.reshape({6});  // needs a copy: transposed memory is not row-major
  EXPECT_FALSE(r.storage().is_same(x.storage()));
  expect_values(r, {1, 4, 2, 5, 3, 6});
  EXPECT_ERROR_CONTAINS(t.view({6}), "use reshape()");
}

}  // namespace
}  // namespace colossal
