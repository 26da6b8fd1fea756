// CUDA-against-CPU comparison harness.
#include "gpu_compare.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "colossal/core/view.h"

namespace colossal::testing {

Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return {1e-12, 1e-10};
    case DType::f32:
      return {1e-5, 1e-5};
    case DType::bf16:
      return {1e-2, 2.0 * 0.0078125};
    case DType::f16:
      return {1e-3, 2.0 * 0.0009765625};
    default:
      return {0, 0};
  }
}

Tensor random_input(const Shape& shape, uint64_t seed, DType dtype, double low, double high, bool requires_grad) {
  Tensor t = random_tensor(shape, seed, low, high, dtype);
  if (requires_grad && core::is_floating(dtype)) t.set_requires_grad(true);
  return t;
}

namespace {
std::vector<Tensor> to_cuda_leaves(const std::vector<Tensor>& cpu) {
  std::vector<Tensor> out;
  for (const Tensor& t : cpu) {
    if (!t.defined()) {
      out.push_back(Tensor());
      continue;
    }
    Tensor g = core::to_device_raw(t.detach(), core::cuda_device(0));
    if (t.requires_grad()) g.set_requires_grad(true);
    out.push_back(g);
  }
  return out;
}
}  // namespace

void expect_cuda_matches_cpu(const DeviceCase& test_case, DType dtype, const std::string& what) {
  const Tolerance tol = tolerance_for(dtype);
  const double atol = tol.atol * test_case.tolerance_scale, rtol = tol.rtol * test_case.tolerance_scale;
  std::vector<Tensor> cpu_inputs = test_case.make_inputs(dtype);
  std::vector<Tensor> gpu_inputs = to_cuda_leaves(cpu_inputs);

  Tensor cpu_out = test_case.fn(cpu_inputs);
  Tensor gpu_out = test_case.fn(gpu_inputs);
  ASSERT_TRUE(gpu_out.device().is_cuda()) << what << ": the GPU run produced a tensor on " << gpu_out.device().str();
  expect_close(gpu_out.to(core::kCpu), cpu_out, atol, rtol,
               what + " forward (" + std::string(core::dtype_name(dtype)) + ")");

  if (!test_case.check_backward || !cpu_out.requires_grad()) return;
  Tensor upstream = random_tensor(cpu_out.shape(), 777, -1.0, 1.0, cpu_out.dtype());
  autograd::backward(cpu_out, upstream);
  autograd::backward(gpu_out, core::to_device_raw(upstream, core::cuda_device(0)));
  for (size_t i = 0; i < cpu_inputs.size(); ++i) {
    if (!cpu_inputs[i].defined() || !cpu_inputs[i].requires_grad()) continue;
    ASSERT_TRUE(gpu_inputs[i].grad().defined()) << what << ": input " << i << " got no gradient on the GPU";
    expect_close(gpu_inputs[i].grad().to(core::kCpu), cpu_inputs[i].grad(), atol, rtol,
                 what + " gradient of input " + std::to_string(i) + " (" + std::string(core::dtype_name(dtype)) + ")");
  }
}

void expect_scaled_match(const DeviceCase& test_case, DType dtype, double factor, const std::string& what) {
  const Tolerance tol = tolerance_for(dtype);
  const Device gpu = core::cuda_device(0);
  auto compare = [&](const Tensor& actual, const Tensor& expected, const std::string& label) {
    const double scale = ops::max(ops::abs(expected.detach().to(DType::f64))).item<double>();
    expect_close(actual.to(core::kCpu), expected, factor * std::min(tol.atol, tol.rtol * scale), factor * tol.rtol,
                 fmt::format("{} {} ({})", what, label, dtype));
  };
  std::vector<Tensor> cpu_inputs = test_case.make_inputs(dtype);
  std::vector<Tensor> gpu_inputs;
  for (const Tensor& t : cpu_inputs) {
    Tensor g = t.defined() ? core::to_device_raw(t.detach(), gpu) : Tensor();
    if (t.defined() && t.requires_grad()) g.set_requires_grad(true);
    gpu_inputs.push_back(g);
  }
  const Tensor cpu_out = test_case.fn(cpu_inputs);
  const Tensor gpu_out = test_case.fn(gpu_inputs);
  compare(gpu_out, cpu_out, "forward");
  if (!test_case.check_backward) return;
  const Tensor upstream = random_input(cpu_out.shape(), 777, cpu_out.dtype(), -1, 1, false);
  autograd::backward(cpu_out, upstream);
  autograd::backward(gpu_out, upstream.to(gpu));
  for (size_t i = 0; i < cpu_inputs.size(); ++i) {
    if (!cpu_inputs[i].defined() || !cpu_inputs[i].requires_grad()) continue;
    ASSERT_TRUE(gpu_inputs[i].grad().defined()) << what << ": input " << i << " got no gradient on the GPU";
    compare(gpu_inputs[i].grad(), cpu_inputs[i].grad(), fmt::format("gradient of input {}", i));
  }
}

}  // namespace colossal::testing
