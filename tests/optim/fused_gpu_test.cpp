// The fused CUDA optimizers (src/colossal/optim/cuda) against the reference loops on the CPU: the
// same model-like parameters and gradients, five steps, each optimizer in several option
// combinations and dtypes, comparing every parameter, state buffer and step count after every
// step. Then several groups with mixed dtypes and more tensors than one launch holds, views the
// vector path or the fused path cannot take, repeatability, and tensors on the wrong device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "colossal/core/view.h"        // narrow_raw
#include "colossal/optim/adam.h"       // Adam, AdamW, adam_step_stub
#include "colossal/optim/clip_grad.h"  // sum_of_squares, scale_
#include "colossal/optim/lamb.h"       // Lamb
#include "colossal/optim/lars.h"       // Lars
#include "colossal/optim/sgd.h"        // Sgd
#include "gpu_compare.h"               // COLOSSAL_REQUIRE_GPU, random_input
#include "gradcheck.h"                 // EXPECT_ERROR_CONTAINS

namespace colossal::optim {
namespace {

using colossal::testing::random_input;

// Tolerances. The kernels round where the reference loops do (Note [Fused optimizer rounding] in
// optim/cuda/multi_tensor_apply.cuh), so SGD and Adam should agree bit for bit. LAMB and LARS add
// their f64 sums of squares in another order (per chunk, then per tensor), so now and then a norm
// rounds to a neighbouring f32 and a trust ratio moves by an ulp (6e-8 relative); it reaches p
// only through lr * trust * update.
//   f32 / f64: 1e-6 / 1e-12 relative. A trust ratio off by an ulp moves p by about
//     lr * |trust * r| * 6e-8 < 1e-9 per step, within 1e-6 * 0.01 * max|p| for five steps; 1e-6 is
//     the f32 bound the fused-optimizer brief asked for.
//   bf16 / f16: 2 ulps, 2^-6 / 2^-9 relative (one ulp is at most 2^-7 / 2^-10 of the value): a
//     rounding flipped where a nearly equal f32 value crossed a boundary, and its echo a step later.
// A bound is relative to |expected| + floor * max|expected| over the tensor: an operand's error in a
// sum that cancels (m = beta1 m + (1 - beta1) g near 0) has the operands' size, not the result's.
// Besides, where bit-identical results are expected (no norms, or 16-bit dtypes, whose rare flips
// touch ~1e-5 of the elements) at most 1% of the elements may differ at all: a rounding the
// kernels missed would change about half of them.
struct Tolerance {
  double rtol;
  double floor;
};

Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return {1e-12, 1e-3};
    case DType::f32:
      return {1e-6, 1e-3};
    case DType::bf16:
      return {std::ldexp(1.0, -6), 0.25};
    case DType::f16:
      return {std::ldexp(1.0, -9), 0.25};
    default:
      break;
  }
  ADD_FAILURE() << "no tolerance for " << core::dtype_name(dtype);
  return {0.0, 0.0};
}

/// EXPECTs `actual` (the fused path) to match `expected` (the CPU reference) within the dtype's
/// tolerance times `scale` and, unless `allow_differences`, to be bit-identical in at least 99% of
/// the elements.
void expect_matches(const Tensor& actual, const Tensor& expected, bool allow_differences, double tolerance_scale,
                    const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  ASSERT_EQ(actual.dtype(), expected.dtype()) << what;
  const Tolerance tol = tolerance_for(expected.dtype());
  const std::vector<double> a = actual.to_vector<double>();
  const std::vector<double> e = expected.to_vector<double>();
  double scale = 0.0;
  for (double v : e) {
    if (std::isfinite(v)) scale = std::max(scale, std::abs(v));
  }
  size_t beyond = 0, differ = 0, first = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    if (a[i] == e[i] || (std::isnan(a[i]) && std::isnan(e[i]))) continue;
    ++differ;
    if (!(std::abs(a[i] - e[i]) <= tolerance_scale * tol.rtol * (std::abs(e[i]) + tol.floor * scale))) {
      if (beyond++ == 0) first = i;
    }
  }
  EXPECT_EQ(beyond, 0u) << what << ": " << beyond << " of " << e.size() << " elements beyond tolerance; first at "
                        << first << ": fused " << fmt::format("{}", a[first]) << ", reference "
                        << fmt::format("{}", e[first]);
  if (!allow_differences) {
    EXPECT_LE(differ * 100, e.size()) << what << ": " << differ << " of " << e.size()
                                      << " elements differ from the reference at all";
  }
}

using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroup>)>;
using MakeGroups = std::function<std::vector<ParamGroup>(const std::vector<Tensor>&)>;

struct OptimizerCase {
  std::string name;
  MakeOptimizer make;
  /// LAMB, and LARS with adaptation: the update depends on norms summed in another order.
  bool uses_norms = false;
};

template <class Opt, class Options>
MakeOptimizer maker(Options options) {
  return [options](std::vector<ParamGroup> groups) { return std::make_unique<Opt>(std::move(groups), options); };
}

std::vector<OptimizerCase> sgd_cases() {
  return {{"SGD", maker<Sgd>(SgdOptions{.lr = 0.1})},
          {"SGD momentum dampening weight_decay",
           maker<Sgd>(SgdOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.25, .weight_decay = 0.01})},
          {"SGD nesterov weight_decay",
           maker<Sgd>(SgdOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true})}};
}

std::vector<OptimizerCase> adam_cases() {
  return {{"Adam", maker<Adam>(AdamOptions{.lr = 1e-2})},
          {"Adam L2 weight_decay", maker<Adam>(AdamOptions{.lr = 1e-2, .weight_decay = 0.1})},
          {"Adam amsgrad", maker<Adam>(AdamOptions{.lr = 1e-2, .amsgrad = true})},
          {"AdamW", maker<AdamW>(AdamOptions{.lr = 1e-2, .weight_decay = 0.1})},
          {"AdamW amsgrad betas eps",
           maker<AdamW>(AdamOptions{
               .lr = 1e-2, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.05, .amsgrad = true})}};
}

std::vector<OptimizerCase> lamb_cases() {
  return {
      {"LAMB", maker<Lamb>(LambOptions{.lr = 1e-2}), true},
      {"LAMB weight_decay", maker<Lamb>(LambOptions{.lr = 1e-2, .weight_decay = 0.01}), true},
      {"LAMB no bias correction, trust_clip 1",
       maker<Lamb>(LambOptions{.lr = 1e-2, .weight_decay = 0.01, .bias_correction = false, .trust_clip = 1.0}), true},
      {"LAMB without trust ratio", maker<Lamb>(LambOptions{.lr = 1e-2, .weight_decay = 0.01, .use_trust_ratio = false}),
       false}};
}

std::vector<OptimizerCase> lars_cases() {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  return {
      {"LARS momentum weight_decay",
       maker<Lars>(LarsOptions{.lr = 0.1, .momentum = 0.9, .eta = 0.1, .weight_decay = 0.01}), true},
      {"LARS eps, grad_clip 0.5 (clamps part of the gradient)",
       maker<Lars>(
           LarsOptions{.lr = 0.1, .momentum = 0.9, .eta = 0.1, .weight_decay = 0.01, .eps = 1e-3, .grad_clip = 0.5}),
       true},
      {"LARS no momentum, no grad clip", maker<Lars>(LarsOptions{.lr = 0.1, .eta = 0.1, .grad_clip = kInf}), true},
      {"LARS without adaptation", maker<Lars>(LarsOptions{.lr = 0.1, .momentum = 0.9, .adaptation = false}), false}};
}

/// The same parameters twice: `reference` (CPU) and `fused` (normally on the GPU).
struct ParamPair {
  std::vector<Tensor> reference, fused;
};

const Device kGpu = core::cuda_device(0);

/// Random parameters in [-1, 1) of `shapes` and `dtypes` (cycled), on the CPU and copied to the GPU.
ParamPair make_params(const std::vector<Shape>& shapes, const std::vector<DType>& dtypes, uint64_t seed) {
  ParamPair pair;
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor p = random_input(shapes[i], seed + i, dtypes[i % dtypes.size()], -1.0, 1.0, false);
    Tensor q = p.to(kGpu);
    pair.reference.push_back(p.set_requires_grad(true));
    pair.fused.push_back(q.set_requires_grad(true));
  }
  return pair;
}

/// Parameter 2 gets its first gradient at step 2 (so its buffers are created while the others'
/// exist and its step count lags) and parameter 1 none at step 3 (its count lags from then on).
bool has_grad(int step, size_t i) {
  return !((i == 2 && step == 1) || (i == 1 && step == 3));
}

MakeGroups one_group = [](const std::vector<Tensor>& params) { return single_group(params); };

/// EXPECTs the parameters, step counts and state buffers of `fused` to match `reference`.
/// `norms_reordered`: f32 and f64 results may differ in the last bits of many elements.
void expect_same_state(const Optimizer& fused, const Optimizer& reference, bool norms_reordered, double tolerance_scale,
                       const std::string& what) {
  for (size_t g = 0; g < reference.param_groups().size(); ++g) {
    for (size_t i = 0; i < reference.param_groups()[g].params.size(); ++i) {
      const Tensor& expected_param = reference.param_groups()[g].params[i];
      const bool allow_differences = norms_reordered && !core::is_reduced_float(expected_param.dtype());
      const std::string where = fmt::format("{}: group {} param {} ({} {})", what, g, i,
                                            core::dtype_name(expected_param.dtype()), expected_param.shape());
      expect_matches(fused.param_groups()[g].params[i], expected_param, allow_differences, tolerance_scale, where);
      const ParamState* want = reference.find_state(g, i);
      const ParamState* got = fused.find_state(g, i);
      ASSERT_EQ(got == nullptr, want == nullptr) << where;
      if (want == nullptr) continue;
      EXPECT_EQ(got->step, want->step) << where;
      ASSERT_EQ(got->buffers.size(), want->buffers.size()) << where;
      for (const auto& [name, buffer] : want->buffers) {
        ASSERT_TRUE(got->buffers.contains(name)) << where << ": no buffer " << name;
        expect_matches(got->buffers.at(name), buffer, allow_differences, tolerance_scale, where + ": " + name);
      }
    }
  }
}

/// Builds the optimizer of `c` over both parameter sets (grouped by `groups`), runs `steps` steps
/// on the same random gradients and compares after each one. A `tolerance_scale` above 1 (for the
/// reference loop running on the GPU) also lets f32 and f64 results differ in their last bits.
/// With `grad_scale` non-zero, every step first hands both optimizers that gradient scale
/// (Optimizer::scale_gradients_in_next_step: clipping's factor, applied inside Adam's kernel and in
/// place before the others').
void expect_fused_matches_reference(const OptimizerCase& c, const ParamPair& params, const MakeGroups& groups,
                                    const std::string& what, double tolerance_scale = 1.0, int steps = 5,
                                    double grad_scale = 0.0) {
  SCOPED_TRACE(what);
  std::unique_ptr<Optimizer> reference = c.make(groups(params.reference));
  std::unique_ptr<Optimizer> fused = c.make(groups(params.fused));
  for (int step = 1; step <= steps; ++step) {
    for (size_t i = 0; i < params.reference.size(); ++i) {
      Tensor p = params.reference[i], q = params.fused[i];
      if (!has_grad(step, i)) {
        p.set_grad(Tensor());
        q.set_grad(Tensor());
        continue;
      }
      const Tensor grad = random_input(p.shape(), 1000 * step + i, p.dtype(), -1.0, 1.0, false);
      p.set_grad(grad);
      q.set_grad(grad.to(q.device()));
    }
    if (grad_scale != 0.0) {
      reference->scale_gradients_in_next_step(core::full({}, grad_scale, DType::f64));
      fused->scale_gradients_in_next_step(core::full({}, grad_scale, TensorOptions(DType::f64, kGpu)));
    }
    reference->step();
    fused->step();
    expect_same_state(*fused, *reference, c.uses_norms || tolerance_scale > 1.0, tolerance_scale,
                      fmt::format("{} step {}", what, step));
    if (::testing::Test::HasFailure()) return;  // one step's report is enough
  }
}

/// A model-like parameter list: a 1-element bias, a tiny vector, one chunk (65536 elements) and one
/// more, several chunks with a tail, and 2-D/3-D weights whose sizes leave vector tails.
const std::vector<Shape> kModelShapes = {{1}, {3}, {65537}, {300000}, {37, 129}, {65536}, {64, 3, 5}, {768, 65}};

void run_cases(const std::vector<OptimizerCase>& cases, const std::vector<DType>& dtypes) {
  for (DType dtype : dtypes) {
    for (const OptimizerCase& c : cases) {
      const ParamPair params = make_params(kModelShapes, {dtype}, 11);
      expect_fused_matches_reference(c, params, one_group, fmt::format("{} {}", c.name, core::dtype_name(dtype)));
    }
  }
}

TEST(FusedOptimizerGpu, Sgd) {
  COLOSSAL_REQUIRE_GPU();
  run_cases(sgd_cases(), {DType::f32, DType::bf16, DType::f16, DType::f64});
}

TEST(FusedOptimizerGpu, AdamAndAdamW) {
  COLOSSAL_REQUIRE_GPU();
  // Not f16: the second moment of a small gradient underflows there (eps 1e-8 rounds to 0 too).
  run_cases(adam_cases(), {DType::f32, DType::bf16, DType::f64});
}

TEST(FusedOptimizerGpu, Lamb) {
  COLOSSAL_REQUIRE_GPU();
  run_cases(lamb_cases(), {DType::f32, DType::bf16, DType::f64});
}

TEST(FusedOptimizerGpu, Lars) {
  COLOSSAL_REQUIRE_GPU();
  run_cases(lars_cases(), {DType::f32, DType::bf16, DType::f64});
}

TEST(FusedOptimizerGpu, SeveralGroupsMixedDtypesAndMoreTensorsThanOneLaunch) {
  COLOSSAL_REQUIRE_GPU();
  // Group 0: 300 f32 tensors, more than any launch holds (TensorTable::kMaxTensors is 63 to 119),
  // so the per-chunk norm partials of later launches sit at an offset. Group 1: 40 tensors
  // alternating f32 and bf16 (one sub-list per dtype) with their own lr and no weight decay.
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  for (int i = 0; i < 340; ++i) {
    const int64_t n = (int64_t{i} * 7919) % 3001 + 1;
    shapes.push_back(i % 5 == 0 ? Shape{n, 7} : Shape{n});
    dtypes.push_back(i < 300 || i % 2 == 0 ? DType::f32 : DType::bf16);
  }
  shapes[17] = {70001};  // a few multi-chunk tensors among the small ones
  shapes[160] = {131073};
  shapes[320] = {65537};
  const MakeGroups two_groups = [](const std::vector<Tensor>& params) {
    ParamGroup decay, no_decay;
    decay.params.assign(params.begin(), params.begin() + 300);
    no_decay.params.assign(params.begin() + 300, params.end());
    no_decay.set("lr", 0.03);
    no_decay.set("weight_decay", 0.0);
    return std::vector<ParamGroup>{decay, no_decay};
  };
  const std::vector<OptimizerCase> cases = {sgd_cases()[2], adam_cases()[4], lamb_cases()[1], lars_cases()[1]};
  for (const OptimizerCase& c : cases) {
    ParamPair params;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const ParamPair one = make_params({shapes[i]}, {dtypes[i]}, 100 + i);
      params.reference.push_back(one.reference[0]);
      params.fused.push_back(one.fused[0]);
    }
    expect_fused_matches_reference(c, params, two_groups, c.name + " (340 tensors, 2 groups, f32 + bf16)");
  }
}

TEST(FusedOptimizerGpu, MisalignedAndStridedParameters) {
  COLOSSAL_REQUIRE_GPU();
  // Views one element past an aligned start take the fused kernels' scalar loop; a transposed
  // parameter is not contiguous and takes the reference loop on the GPU, whose elementwise kernels
  // contract to FMA and whose sums accumulate in f32 (ops/cuda/reduction_kernels.cu): its norms
  // agree with the CPU's to ~1e-6 rather than ~1e-7, hence 100x the tolerance, and no bit-identity
  // check in f32.
  auto views = [](uint64_t seed) {
    ParamPair pair;
    auto add = [&](const Tensor& base, const std::function<Tensor(const Tensor&)>& view) {
      Tensor p = view(base).detach();
      Tensor q = view(base.to(kGpu)).detach();
      pair.reference.push_back(p.set_requires_grad(true));
      pair.fused.push_back(q.set_requires_grad(true));
    };
    add(random_input({70002}, seed, DType::f32, -1, 1, false), [](const Tensor& t) { return t.narrow(0, 1, 70001); });
    add(random_input({4100}, seed + 1, DType::bf16, -1, 1, false),
        [](const Tensor& t) { return t.narrow(0, 3, 4097); });
    add(random_input({33, 65}, seed + 2, DType::f32, -1, 1, false), [](const Tensor& t) { return t.t(); });
    add(random_input({1000}, seed + 3, DType::f32, -1, 1, false), [](const Tensor& t) { return t; });
    return pair;
  };
  const std::vector<OptimizerCase> cases = {sgd_cases()[1], adam_cases()[3], lamb_cases()[1], lars_cases()[0]};
  for (const OptimizerCase& c : cases) {
    const ParamPair params = views(7);
    ASSERT_FALSE(params.fused[2].is_contiguous());
    expect_fused_matches_reference(c, params, one_group, c.name + " (misaligned and strided views)", 100.0);
  }
}

TEST(FusedOptimizerGpu, NormBasedOptimizersRepeatBitForBit) {
  COLOSSAL_REQUIRE_GPU();
  // The per-chunk partials are summed in a fixed order: two runs give the same bits.
  for (const OptimizerCase& c : {lamb_cases()[1], lars_cases()[0]}) {
    std::vector<std::vector<double>> runs;
    for (int run = 0; run < 2; ++run) {
      const ParamPair params = make_params(kModelShapes, {DType::f32}, 5);
      std::unique_ptr<Optimizer> optimizer = c.make(single_group(params.fused));
      for (int step = 1; step <= 3; ++step) {
        for (size_t i = 0; i < params.fused.size(); ++i) {
          Tensor q = params.fused[i];
          q.set_grad(random_input(q.shape(), 1000 * step + i, q.dtype(), -1, 1, false).to(kGpu));
        }
        optimizer->step();
      }
      std::vector<double> all;
      for (const Tensor& q : params.fused) {
        const std::vector<double> v = q.to_vector<double>();
        all.insert(all.end(), v.begin(), v.end());
      }
      runs.push_back(std::move(all));
    }
    EXPECT_EQ(runs[0], runs[1]) << c.name;
  }
}

TEST(FusedOptimizerGpu, ParametersOnTwoDevicesAndMisplacedTensors) {
  COLOSSAL_REQUIRE_GPU();
  // One group may hold CPU and GPU parameters: the optimizer updates each device's bucket on its
  // own path (here the CPU reference for parameter 1, the fused kernel for 0 and 2).
  {
    ParamPair params = make_params({{300}, {5}, {70000}}, {DType::f32}, 3);
    params.fused[1] = params.reference[1].detach().clone().set_requires_grad(true);
    expect_fused_matches_reference(adam_cases()[3], params, one_group, "AdamW over cuda:0, cpu, cuda:0 parameters");
  }
  // A gradient on another device than its parameter is refused, naming the parameter.
  {
    Tensor p = random_input({4}, 1, DType::f32, -1, 1, true);
    p.set_grad(random_input({4}, 2, DType::f32, -1, 1, false).to(kGpu));
    AdamW optimizer(std::vector<Tensor>{p});
    EXPECT_ERROR_CONTAINS(optimizer.step(), "is on cpu but its gradient is on cuda:0");
  }
  // Handed a CPU tensor among GPU ones, the fused kernel names it before touching anything.
  {
    MultiTensorLists lists;
    lists.device = kGpu;
    lists.params = {core::zeros({8}, TensorOptions(DType::f32, kGpu)), core::zeros({8}, DType::f32)};
    lists.grads = {core::ones({8}, TensorOptions(DType::f32, kGpu)), core::ones({8}, TensorOptions(DType::f32, kGpu))};
    lists.state.resize(2);
    for (auto& buffers : lists.state) {
      buffers = {core::zeros({8}, TensorOptions(DType::f32, kGpu)), core::zeros({8}, TensorOptions(DType::f32, kGpu))};
    }
    lists.steps = {1, 1};
    lists.buffers_created = {1, 1};
    EXPECT_ERROR_CONTAINS(adam_step_stub(kGpu, lists, AdamOptions{}, WeightDecayMode::decoupled),
                          "adam_step: parameter 1 is on cpu but the fused update runs on cuda:0");
    EXPECT_EQ(lists.params[0].to_vector<float>(), std::vector<float>(8, 0.0f)) << "nothing was updated";
  }
}

TEST(FusedOptimizerGpu, GradientScaleInsideTheUpdate) {
  // Clipping's factor (0.37: not a power of two, so every product rounds) through the fused update:
  // bit for bit the reference's ops::mul of each gradient by the scale rounded to its accumulation
  // type, for Adam/AdamW (inside the kernel) and SGD/LAMB (scaled in place first).
  COLOSSAL_REQUIRE_GPU();
  std::vector<OptimizerCase> cases = adam_cases();
  cases.push_back(sgd_cases()[1]);
  cases.push_back(lamb_cases()[1]);
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    for (const OptimizerCase& c : cases) {
      const ParamPair params = make_params(kModelShapes, {dtype}, 17);
      expect_fused_matches_reference(c, params, one_group,
                                     fmt::format("{} {} with a gradient scale", c.name, core::dtype_name(dtype)), 1.0,
                                     3, 0.37);
    }
  }
}

TEST(ClipGradGpu, SumOfSquaresAndScaleMatchTheCpu) {
  // More tensors than one launch's table holds, of every floating dtype, several chunks with ragged
  // tails, and views off a 16-byte boundary (the per-element path). The squares are exact in f64
  // (a 24-bit mantissa squared fits 53 bits), so the totals differ only by the order of the f64
  // additions: relative 1e-12 covers ~10^4 partials. Scaled tensors are compared bit for bit.
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = core::cuda_device(0);
  const std::vector<DType> dtypes = {DType::f32, DType::bf16, DType::f16, DType::f64};
  for (const double scale : {1.0, 1.0 / 1024, 0.37}) {
    std::vector<Tensor> cpu, dev;
    for (int i = 0; i < 700; ++i) {
      const int64_t numel = i % 97 == 0 ? 3 * 65536 + 123 : 1 + (i * 37) % 300;
      const int64_t offset = i % 7 == 0 ? 3 : 0;
      const Tensor buffer = random_input({numel + 3}, 500 + i, dtypes[size_t(i) % dtypes.size()], -4, 4, false);
      cpu.push_back(core::narrow_raw(buffer, 0, offset, numel));
      dev.push_back(core::narrow_raw(buffer.to(gpu), 0, offset, numel));
    }
    const double expected = sum_of_squares(cpu, scale).item<double>();
    const Tensor actual = sum_of_squares(dev, scale);
    EXPECT_EQ(actual.device(), gpu);
    EXPECT_NEAR(actual.item<double>(), expected, 1e-12 * expected) << "scale " << scale;
    for (size_t i = 0; i < cpu.size(); ++i) {
      ASSERT_EQ(dev[i].to(core::kCpu).to_vector<double>(), cpu[i].to_vector<double>())
          << "tensor " << i << " after scaling by " << scale;
    }
    const Tensor factor = core::full({}, 1.0 / 3.0, DType::f64);
    scale_(cpu, factor);
    scale_(dev, factor.to(gpu));
    for (size_t i = 0; i < cpu.size(); ++i) {
      ASSERT_EQ(dev[i].to(core::kCpu).to_vector<double>(), cpu[i].to_vector<double>()) << "tensor " << i << " scale_";
    }
  }
  // A non-finite element makes the sum non-finite; a huge finite f32 does not.
  Tensor big = core::full({70000}, 1e20, TensorOptions(DType::f32, gpu));
  EXPECT_TRUE(std::isfinite(sum_of_squares({big}).item<double>()));
  big.narrow(0, 69999, 1).fill_(std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isinf(sum_of_squares({big}).item<double>()));
}

TEST(MultiTensorCopyGpu, MatchesTheCpuAcrossDtypesChunksLaunchesAndMisalignedViews) {
  COLOSSAL_REQUIRE_GPU();
  // 16-bit <-> f32 both ways and f32 -> f32, over more tensors than one launch's table holds,
  // tensors of several chunks (65536 elements each) with a ragged tail, and contiguous views that
  // start off a 16-byte boundary (the per-element path). Conversions round to nearest even on both
  // devices, so the results are compared bit for bit.
  const Device gpu = core::cuda_device(0);
  const std::vector<std::pair<DType, DType>> pairs = {{DType::f32, DType::bf16},
                                                      {DType::bf16, DType::f32},
                                                      {DType::f32, DType::f16},
                                                      {DType::f16, DType::f32},
                                                      {DType::f32, DType::f32}};
  std::vector<Tensor> dst_cpu, src_cpu, dst_gpu, src_gpu;
  uint64_t seed = 100;
  for (int i = 0; i < 700; ++i) {
    const auto [dst_dtype, src_dtype] = pairs[size_t(i) % pairs.size()];
    const int64_t numel = i % 97 == 0 ? 3 * 65536 + 123 : 1 + (i * 37) % 300;
    const Tensor src = random_input({numel + 3}, seed++, src_dtype, -4, 4, false);
    // Every seventh pair starts 3 elements into its buffer: misaligned for 16-byte accesses.
    const int64_t offset = i % 7 == 0 ? 3 : 0;
    const Tensor src_view = core::narrow_raw(src, 0, offset, numel);
    const Tensor src_dev = core::narrow_raw(src.to(gpu), 0, offset, numel);
    const Tensor dst_dev_buffer = core::empty({numel + 3}, TensorOptions(dst_dtype, gpu));
    src_cpu.push_back(src_view);
    src_gpu.push_back(src_dev);
    dst_cpu.push_back(core::empty({numel}, TensorOptions(dst_dtype)));
    dst_gpu.push_back(core::narrow_raw(dst_dev_buffer, 0, offset, numel));
  }
  multi_tensor_copy(dst_cpu, src_cpu);
  multi_tensor_copy(dst_gpu, src_gpu);
  for (size_t i = 0; i < dst_cpu.size(); ++i) {
    const Tensor expected = dst_cpu[i].to(DType::f64), actual = dst_gpu[i].to(core::kCpu).to(DType::f64);
    const auto e = expected.to_vector<double>(), a = actual.to_vector<double>();
    ASSERT_EQ(e, a) << "pair " << i << " (" << core::dtype_name(dst_cpu[i].dtype()) << " <- "
                    << core::dtype_name(src_cpu[i].dtype()) << ", " << e.size() << " elements)";
  }
}

}  // namespace
}  // namespace colossal::optim
