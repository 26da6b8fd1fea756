// Finite-difference gradient checks and tensor comparisons for tests.
#include "gradcheck.h"

#include <gtest/gtest.h>

#include <cmath>

#include "colossal/core/view.h"

namespace colossal::testing {

namespace {
double contract(const Tensor& out, const std::vector<double>& weights) {
  const std::vector<double> values = out.to_vector<double>();
  double total = 0.0;
  for (size_t i = 0; i < values.size(); ++i) total += values[i] * weights[i];
  return total;
}
}  // namespace

void check_gradients(const GradCheckCase& test_case) {
  std::vector<Tensor> inputs = test_case.make_inputs();
  bool any = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || !inputs[i].requires_grad()) continue;
    any = true;
    ASSERT_EQ(inputs[i].dtype(), DType::f64) << "input " << i << " must be f64 for a gradient check";
    ASSERT_TRUE(inputs[i].is_contiguous() && inputs[i].is_leaf()) << "input " << i << " must be a contiguous leaf";
  }
  ASSERT_TRUE(any) << "no input requires grad: nothing to check";

  Tensor out = test_case.fn(inputs);
  ASSERT_TRUE(out.defined());
  ASSERT_TRUE(out.requires_grad()) << "the output does not depend on any differentiable input";
  // Fixed random weights make every output element matter with a different coefficient.
  Tensor weights_tensor = random_tensor(out.shape(), 0xC0FFEE, -1.0, 1.0, out.dtype());
  const std::vector<double> weights = weights_tensor.to_vector<double>();
  autograd::backward(out, weights_tensor);

  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor& input = inputs[i];
    if (!input.defined() || !input.requires_grad()) continue;
    Tensor analytic = input.grad();
    ASSERT_TRUE(analytic.defined()) << "input " << i << " received no gradient";
    ASSERT_EQ(analytic.shape(), input.shape());
    const std::vector<double> analytic_values = analytic.to_vector<double>();
    double* data = input.data<double>();
    int reported = 0;
    for (int64_t j = 0; j < input.numel(); ++j) {
      const double saved = data[j];
      double plus, minus;
      {
        autograd::NoGradGuard no_grad;
        data[j] = saved + test_case.eps;
        plus = contract(test_case.fn(inputs), weights);
        data[j] = saved - test_case.eps;
        minus = contract(test_case.fn(inputs), weights);
        data[j] = saved;
      }
      const double numeric = (plus - minus) / (2.0 * test_case.eps);
      const double got = analytic_values[j];
      const double bound = test_case.atol + test_case.rtol * std::abs(numeric);
      if (!(std::abs(got - numeric) <= bound)) {
        ADD_FAILURE() << "input " << i << " (shape " << fmt::format("{}", input.shape()) << ") element " << j
                      << ": autograd " << got << " vs finite difference " << numeric << " (|diff| "
                      << std::abs(got - numeric) << " > " << bound << ")";
        if (++reported >= 5) break;
      }
    }
  }
}

Tensor random_tensor(const Shape& shape, uint64_t seed, double low, double high, DType dtype) {
  core::Generator gen(seed);
  Tensor t = core::empty(shape, DType::f64);
  core::uniform_(t, low, high, &gen);
  return dtype == DType::f64 ? t : core::cast_raw(t, dtype);
}

Tensor random_leaf(const Shape& shape, uint64_t seed, double low, double high) {
  Tensor t = random_tensor(shape, seed, low, high);
  t.set_requires_grad(true);
  return t;
}

void expect_close(const Tensor& actual, const Tensor& expected, double atol, double rtol, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what << ": actual is undefined";
  ASSERT_TRUE(expected.defined()) << what << ": expected is undefined";
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const auto a = actual.to_vector<double>();
  const auto e = expected.to_vector<double>();
  double worst = 0.0;
  size_t worst_at = 0;
  bool failed = false;
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = std::abs(a[i] - e[i]);
    const bool ok = diff <= atol + rtol * std::abs(e[i]) || (std::isnan(a[i]) && std::isnan(e[i])) ||
                    (std::isinf(a[i]) && a[i] == e[i]);
    if (!ok && (!failed || diff > worst || std::isnan(diff))) {
      worst = diff;
      worst_at = i;
      failed = true;
    }
  }
  EXPECT_FALSE(failed) << what << ": element " << worst_at << " is " << a[worst_at] << ", expected " << e[worst_at]
                       << " (|diff| " << worst << ", atol " << atol << ", rtol " << rtol << ")";
}

void expect_values(const Tensor& actual, const std::vector<double>& expected, double atol, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what;
  const auto a = actual.to_vector<double>();
  ASSERT_EQ(a.size(), expected.size()) << what << ": shape " << fmt::format("{}", actual.shape());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], expected[i], atol) << what << ": element " << i;
  }
}

}  // namespace colossal::testing
