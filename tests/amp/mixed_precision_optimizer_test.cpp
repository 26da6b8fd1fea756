// MixedPrecisionOptimizer on a small MLP: naive fp16 keeps f32 masters that step exactly as f32 SGD on
// the unscaled gradients and rounds them into the fp16 model; an overflowing step (injected or from a
// too-large scale) is skipped and the scale backs off after `hysteresis` overflows; the found-inf hook
// is called once per step and a remote overflow skips the local step; clipping sees unscaled
// gradients; torch mode equals f32 training bit for bit; bf16 tracks f32 within a stated tolerance;
// the state round trip resumes bit-exactly.
#include "colossal/amp/mixed_precision_optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "amp_test_util.h"             // make_mlp, random_batch
#include "colossal/autograd/engine.h"  // backward
#include "colossal/core/error.h"
#include "colossal/core/view.h"  // cast_raw
#include "colossal/ops/elementwise.h"
#include "colossal/ops/reduction.h"
#include "colossal/optim/adam.h"
#include "colossal/optim/clip_grad.h"
#include "colossal/optim/sgd.h"

namespace colossal::amp {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

using testing::random_batch;

/// Linear(4, 16) - GELU - Linear(16, 3) in f32, initialised from Generator(seed).
std::shared_ptr<nn::Sequential> make_mlp(uint64_t seed) {
  return testing::make_mlp(seed, {.in = 4, .hidden = 16, .out = 3});
}

Tensor mse(const Tensor& output, const Tensor& target) {
  Tensor diff = ops::sub(output, target);
  return ops::mean(ops::mul(diff, diff));
}

std::shared_ptr<optim::Sgd> make_sgd(nn::Module& model, double lr, double momentum = 0.0) {
  optim::SgdOptions options;
  options.lr = lr;
  options.momentum = momentum;
  return std::make_shared<optim::Sgd>(optim::make_param_groups(model.named_parameters(), 0.0), options);
}

/// Forward and scaled backward of micro-batch `step` through `amp` (no optimizer step); returns the loss.
double forward_backward(MixedPrecisionOptimizer& amp, int step) {
  const Tensor x = random_batch(8, 4, 100 + step);
  const Tensor y = random_batch(8, 3, 200 + step);
  const Tensor loss = mse(amp.cast_output(amp.model().forward(amp.cast_input(x))), y);
  amp.backward(loss);
  return loss.item<double>();
}

/// One training step: forward_backward, step, zero_grad.
AmpStepResult train_step(MixedPrecisionOptimizer& amp, int step, std::optional<double> max_norm = std::nullopt) {
  forward_backward(amp, step);
  const AmpStepResult result = amp.step(max_norm);
  amp.zero_grad();
  return result;
}

std::vector<Tensor> clones(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> out;
  for (const Tensor& t : tensors) out.push_back(t.clone());
  return out;
}

std::vector<Tensor> grads_of(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) out.push_back(p.grad().clone());
  return out;
}

optim::StateDict clone_state(const optim::StateDict& state) {
  optim::StateDict out;
  for (const auto& [key, value] : state) out.emplace(key, value.clone());
  return out;
}

/// Bit patterns of a tensor as floats (exact for f16, bf16 and f32).
std::vector<float> bits(const Tensor& t) {
  return t.to_vector<float>();
}

void expect_same_tensors(const std::vector<Tensor>& a, const std::vector<Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(a[k].dtype(), b[k].dtype()) << what << " #" << k;
    EXPECT_EQ(bits(a[k]), bits(b[k])) << what << " #" << k;
  }
}

/// The model parameters equal their masters rounded to `dtype` (round to nearest even).
void expect_params_are_rounded_masters(const MixedPrecisionOptimizer& amp, DType dtype) {
  for (size_t k = 0; k < amp.model_params().size(); ++k) {
    ASSERT_EQ(amp.model_params()[k].dtype(), dtype);
    EXPECT_EQ(bits(amp.model_params()[k]), bits(core::cast_raw(amp.master_params()[k], dtype))) << amp.param_names()[k];
  }
}

/// Sets element 0 of the first parameter's gradient to `value`, as a backward that overflowed would.
void poison_first_grad(MixedPrecisionOptimizer& amp, float value) {
  Tensor grad = amp.model_params().front().grad();
  ASSERT_TRUE(grad.defined());
  ASSERT_EQ(grad.dtype(), DType::f16);
  grad.data<core::Half>()[0] = core::Half(value);
}

/// What the f32 masters must become: plain f32 SGD (same options) over copies of `masters` whose
/// gradients are the model's fp16 gradients `grads16` converted to f32 and multiplied by `inv_scale`.
std::vector<Tensor> reference_sgd_step(const std::vector<Tensor>& masters, const std::vector<Tensor>& grads16,
                                       double inv_scale, double lr, std::optional<double> max_norm = std::nullopt,
                                       double* norm = nullptr) {
  std::vector<Tensor> params = clones(masters);
  for (size_t k = 0; k < params.size(); ++k) {
    Tensor grad = core::cast_raw(grads16[k], DType::f32).clone();
    ops::mul_(grad, inv_scale);
    params[k].set_grad(grad);
  }
  if (max_norm) *norm = optim::clip_grad_norm(params, *max_norm);
  optim::SgdOptions options;
  options.lr = lr;
  optim::Sgd sgd(params, options);
  sgd.step();
  return params;
}

TEST(NaiveAmp, ConvertsTheModelAndHandsF32MastersToTheOptimizer) {
  auto model = make_mlp(1);
  auto original = make_mlp(1);
  auto sgd = make_sgd(*model, 0.1);
  MixedPrecisionOptimizer amp(model, sgd, AmpOptions::for_mode(AmpMode::naive));

  EXPECT_EQ(amp.compute_dtype(), DType::f16);
  EXPECT_EQ(amp.loss_scale(), 65536.0);
  ASSERT_EQ(amp.master_params().size(), 4u);
  for (size_t k = 0; k < amp.master_params().size(); ++k) {
    EXPECT_EQ(amp.master_params()[k].dtype(), DType::f32);
    EXPECT_EQ(bits(amp.master_params()[k]), bits(original->parameter(amp.param_names()[k])))
        << "the master is the f32 parameter it replaces: " << amp.param_names()[k];
  }
  expect_params_are_rounded_masters(amp, DType::f16);
  std::vector<Tensor> held;
  for (const auto& group : sgd->param_groups()) held.insert(held.end(), group.params.begin(), group.params.end());
  ASSERT_EQ(held.size(), amp.master_params().size());
  for (size_t k = 0; k < held.size(); ++k) {
    EXPECT_TRUE(held[k].is_same(amp.master_params()[k])) << "the optimizer steps the masters";
    EXPECT_TRUE(amp.model_params()[k].is_same(model->parameter(amp.param_names()[k])));
  }
}

TEST(NaiveAmp, CleanStepUpdatesF32MastersAndRoundsThemIntoTheModel) {
  constexpr double kLr = 0.05;
  auto model = make_mlp(2);
  AmpOptions options = AmpOptions::for_mode(AmpMode::naive);
  options.scaler.initial_scale = 1024;
  MixedPrecisionOptimizer amp(model, make_sgd(*model, kLr), options);

  int64_t below_f16_resolution = 0;  // master elements that f16 cannot tell from their rounding
  for (int step = 0; step < 3; ++step) {
    forward_backward(amp, step);
    const std::vector<Tensor> grads16 = grads_of(amp.model_params());
    const std::vector<Tensor> expected = reference_sgd_step(amp.master_params(), grads16, 1.0 / 1024, kLr);
    const AmpStepResult result = amp.step();
    EXPECT_TRUE(result.stepped);
    EXPECT_EQ(result.loss_scale, 1024.0);
    EXPECT_FALSE(result.grad_norm.defined());
    expect_same_tensors(amp.master_params(), expected, "masters after the f32 update");
    expect_params_are_rounded_masters(amp, DType::f16);
    for (const Tensor& p : amp.model_params()) EXPECT_FALSE(p.grad().defined()) << "moved to the master";
    amp.zero_grad();
    for (const Tensor& m : amp.master_params()) EXPECT_FALSE(m.grad().defined());
  }
  for (const Tensor& master : amp.master_params()) {
    const std::vector<float> exact = bits(master);
    const std::vector<float> rounded = bits(core::cast_raw(master, DType::f16));
    for (size_t i = 0; i < exact.size(); ++i) below_f16_resolution += exact[i] != rounded[i];
  }
  EXPECT_GT(below_f16_resolution, 0) << "the masters should hold digits the f16 model cannot";
  EXPECT_EQ(amp.scaler()->growth_tracker(), 3);
}

TEST(NaiveAmp, GradientsOfAccumulatedMicroStepsAreSummedThenUnscaled) {
  constexpr double kLr = 0.05;
  auto model = make_mlp(3);
  AmpOptions options = AmpOptions::for_mode(AmpMode::naive);
  options.scaler.initial_scale = 256;
  MixedPrecisionOptimizer amp(model, make_sgd(*model, kLr), options);
  forward_backward(amp, 0);
  forward_backward(amp, 1);  // accumulates into the same fp16 gradients, at the same scale
  const std::vector<Tensor> expected =
      reference_sgd_step(amp.master_params(), grads_of(amp.model_params()), 1.0 / 256, kLr);
  EXPECT_TRUE(amp.step().stepped);
  expect_same_tensors(amp.master_params(), expected, "masters after an accumulated step");
}

TEST(NaiveAmp, SkipsAnOverflowingStepAndBacksOffItsScaleAfterHysteresisOverflows) {
  auto model = make_mlp(4);
  auto sgd = make_sgd(*model, 0.05, 0.9);
  MixedPrecisionOptimizer amp(model, sgd, AmpOptions::for_mode(AmpMode::naive));  // 2^16, hysteresis 2
  ASSERT_TRUE(train_step(amp, 0).stepped);  // creates the momentum buffers the skips must not touch

  const std::vector<Tensor> masters = clones(amp.master_params());
  const std::vector<Tensor> params = clones(amp.model_params());
  const optim::StateDict optimizer_state = clone_state(sgd->state_dict());
  const auto expect_untouched = [&](const char* when) {
    expect_same_tensors(amp.master_params(), masters, when);
    expect_same_tensors(amp.model_params(), params, when);
    const optim::StateDict now = sgd->state_dict();
    for (const auto& [key, value] : optimizer_state) EXPECT_EQ(bits(now.at(key)), bits(value)) << when << " " << key;
    for (size_t k = 0; k < params.size(); ++k) {
      EXPECT_FALSE(amp.model_params()[k].grad().defined()) << when;
      EXPECT_FALSE(amp.master_params()[k].grad().defined()) << when;
    }
  };

  forward_backward(amp, 1);
  poison_first_grad(amp, kInf);
  AmpStepResult result = amp.step();
  EXPECT_FALSE(result.stepped);
  EXPECT_EQ(result.loss_scale, 65536.0);
  expect_untouched("after the first overflow");
  EXPECT_EQ(amp.loss_scale(), 65536.0) << "the first overflow is within the hysteresis";
  EXPECT_EQ(amp.scaler()->hysteresis_tracker(), 1);

  forward_backward(amp, 2);
  poison_first_grad(amp, std::numeric_limits<float>::quiet_NaN());
  result = amp.step();
  EXPECT_FALSE(result.stepped);
  expect_untouched("after the second overflow");
  EXPECT_EQ(amp.loss_scale(), 32768.0) << "the second overflow backs off";

  result = train_step(amp, 3);
  EXPECT_TRUE(result.stepped);
  EXPECT_EQ(result.loss_scale, 32768.0);
  EXPECT_NE(bits(amp.master_params()[0]), bits(masters[0]));
  expect_params_are_rounded_masters(amp, DType::f16);
}

TEST(NaiveAmp, ATooLargeScaleOverflowsInTheFp16BackwardAndIsBackedOffUntilStepsSucceed) {
  auto model = make_mlp(5);
  AmpOptions options = AmpOptions::for_mode(AmpMode::naive);
  options.scaler.initial_scale = std::ldexp(1.0, 28);  // MSE gradients near 1 times 2^28 >> 65504 (f16 max)
  MixedPrecisionOptimizer amp(model, make_sgd(*model, 0.05), options);
  int skipped = 0;
  int step = 0;
  for (; step < 40; ++step) {
    const std::vector<Tensor> masters = clones(amp.master_params());
    const AmpStepResult result = train_step(amp, step);
    if (result.stepped) break;
    ++skipped;
    expect_same_tensors(amp.master_params(), masters, "a skipped step");
  }
  ASSERT_LT(step, 40) << "the scale never came down far enough";
  // Hysteresis 2: the first overflow keeps the scale, each later one halves it, so k skips end at
  // 2^(28 - (k - 1)).
  EXPECT_GE(skipped, 2);
  EXPECT_EQ(amp.loss_scale(), std::ldexp(1.0, 28 - (skipped - 1)));
  EXPECT_LT(amp.loss_scale(), std::ldexp(1.0, 28));
}

TEST(NaiveAmp, FoundInfHookIsCalledOncePerStepAndARemoteOverflowSkipsTheLocalStep) {
  auto model = make_mlp(6);
  MixedPrecisionOptimizer amp(model, make_sgd(*model, 0.05), AmpOptions::for_mode(AmpMode::naive));
  std::vector<bool> seen;        // the local flags the hook received
  bool remote_overflow = false;  // what "another rank" reports
  amp.set_found_inf_sync([&](bool local) {
    seen.push_back(local);
    return local || remote_overflow;  // an all-reduce(max) over two ranks
  });

  remote_overflow = true;
  const std::vector<Tensor> masters = clones(amp.master_params());
  AmpStepResult result = train_step(amp, 0);
  EXPECT_FALSE(result.stepped) << "the other rank overflowed, so this one must skip too";
  expect_same_tensors(amp.master_params(), masters, "a remotely skipped step");
  EXPECT_EQ(amp.scaler()->hysteresis_tracker(), 1) << "the scaler saw the overflow every rank sees";
  ASSERT_EQ(seen, (std::vector<bool>{false}));

  remote_overflow = false;
  forward_backward(amp, 1);
  poison_first_grad(amp, kInf);
  EXPECT_FALSE(amp.step().stepped);
  amp.zero_grad();
  ASSERT_EQ(seen, (std::vector<bool>{false, true})) << "a local overflow still goes through the hook";
  EXPECT_EQ(amp.loss_scale(), 32768.0);

  EXPECT_TRUE(train_step(amp, 2).stepped);
  EXPECT_EQ(seen, (std::vector<bool>{false, true, false}));
}

TEST(NaiveAmp, ClippingSeesTheUnscaledGradients) {
  constexpr double kLr = 0.05;
  constexpr double kMaxNorm = 0.01;  // far below the gradient norm, so the step clips
  auto model = make_mlp(7);
  AmpOptions options = AmpOptions::for_mode(AmpMode::naive);
  options.scaler.initial_scale = 4096;
  MixedPrecisionOptimizer amp(model, make_sgd(*model, kLr), options);
  forward_backward(amp, 0);
  double expected_norm = 0;
  const std::vector<Tensor> expected =
      reference_sgd_step(amp.master_params(), grads_of(amp.model_params()), 1.0 / 4096, kLr, kMaxNorm, &expected_norm);
  const AmpStepResult result = amp.step(kMaxNorm);
  ASSERT_TRUE(result.grad_norm.defined());
  EXPECT_EQ(result.grad_norm.item<double>(), expected_norm) << "the norm of the unscaled f32 gradients";
  EXPECT_GT(expected_norm, kMaxNorm);
  EXPECT_LT(expected_norm, 100.0) << "a scaled norm would be thousands";
  expect_same_tensors(amp.master_params(), expected, "masters after a clipped step");
  amp.zero_grad();

  int calls = 0;
  amp.set_grad_norm([&](const std::vector<Tensor>& params, double norm_type, const Tensor& local_sum_of_squares) {
    ++calls;
    EXPECT_EQ(params.size(), amp.master_params().size());
    EXPECT_TRUE(params[0].is_same(amp.master_params()[0]));
    EXPECT_EQ(norm_type, 2.0);
    // The overflow check's sum of squares of the unscaled gradients, handed over for reuse.
    EXPECT_TRUE(local_sum_of_squares.defined());
    EXPECT_NEAR(std::sqrt(local_sum_of_squares.item<double>()), optim::total_grad_norm(params).item<double>(), 1e-12);
    return core::full({}, 42.0, DType::f64);
  });
  EXPECT_EQ(train_step(amp, 1, kMaxNorm).grad_norm.item<double>(), 42.0);
  EXPECT_EQ(calls, 1);
}

TEST(TorchAmp, WithAPowerOfTwoScaleTrainsBitForBitAsF32) {
  // Scaling by 2^k commutes with rounding (no value here comes near overflow or the subnormals), so
  // the scaled backward and the unscale give exactly the f32 gradients. See Note [torch mode without
  // autocast] in mixed_precision_optimizer.cpp.
  constexpr double kLr = 0.05;
  auto reference = make_mlp(8);
  auto reference_sgd = make_sgd(*reference, kLr, 0.9);
  auto model = make_mlp(8);
  auto sgd = make_sgd(*model, kLr, 0.9);
  MixedPrecisionOptimizer amp(model, sgd, AmpOptions::for_mode(AmpMode::torch));
  EXPECT_EQ(amp.compute_dtype(), DType::f32);
  EXPECT_EQ(amp.scaler()->options().growth_interval, 2000);
  std::vector<Tensor> held;
  for (const auto& group : sgd->param_groups()) held.insert(held.end(), group.params.begin(), group.params.end());
  ASSERT_EQ(held.size(), amp.model_params().size());
  for (size_t k = 0; k < amp.model_params().size(); ++k) {
    EXPECT_TRUE(amp.model_params()[k].is_same(amp.master_params()[k]));
    EXPECT_TRUE(held[k].is_same(amp.model_params()[k])) << "torch mode steps the model's own parameters";
  }
  for (int step = 0; step < 4; ++step) {
    const Tensor x = random_batch(8, 4, 100 + step);
    const Tensor y = random_batch(8, 3, 200 + step);
    autograd::backward(mse(reference->forward(x), y));
    reference_sgd->step();
    reference_sgd->zero_grad();
    EXPECT_TRUE(train_step(amp, step).stepped);
    expect_same_tensors(model->parameters(), reference->parameters(), "torch AMP against f32 training");
  }
}

TEST(TorchAmp, BacksOffAtTheFirstOverflow) {
  auto model = make_mlp(9);
  MixedPrecisionOptimizer amp(model, make_sgd(*model, 0.05), AmpOptions::for_mode(AmpMode::torch));
  const std::vector<Tensor> params = clones(amp.model_params());
  forward_backward(amp, 0);
  Tensor grad = amp.model_params().front().grad();
  grad.data<float>()[0] = kInf;
  EXPECT_FALSE(amp.step().stepped);
  EXPECT_EQ(amp.loss_scale(), 32768.0) << "torch's rule has no hysteresis";
  expect_same_tensors(amp.model_params(), params, "a skipped torch-mode step");
  EXPECT_FALSE(amp.model_params().front().grad().defined());
}

TEST(Bf16Amp, TrainsWithinToleranceOfF32) {
  constexpr double kLr = 0.1;
  constexpr int kSteps = 10;
  auto reference = make_mlp(10);
  auto reference_sgd = make_sgd(*reference, kLr, 0.9);
  auto initial = make_mlp(10);
  auto model = make_mlp(10);
  MixedPrecisionOptimizer amp(model, make_sgd(*model, kLr, 0.9), AmpOptions::for_mode(AmpMode::bf16));
  int hook_calls = 0;
  amp.set_found_inf_sync([&](bool local) {
    ++hook_calls;
    return local;
  });
  EXPECT_EQ(amp.scaler(), nullptr);
  EXPECT_EQ(amp.loss_scale(), 1.0);

  for (int step = 0; step < kSteps; ++step) {
    const Tensor x = random_batch(8, 4, 100 + step);
    const Tensor y = random_batch(8, 3, 200 + step);
    const Tensor reference_loss = mse(reference->forward(x), y);
    autograd::backward(reference_loss);
    reference_sgd->step();
    reference_sgd->zero_grad();
    const double loss = forward_backward(amp, step);
    const AmpStepResult result = amp.step();
    amp.zero_grad();
    EXPECT_TRUE(result.stepped);
    EXPECT_EQ(result.loss_scale, 1.0);
    // bf16 keeps 8 significant bits: each rounding is off by at most 2^-9 (0.2%) relatively. An output
    // passes through about four of them (input, first-layer weight, hidden activation, second-layer
    // weight; products are accumulated in f32), so it is off by at most ~4 * 2^-9 = 0.8% of its size
    // and the MSE (whose residuals are as large as the outputs: the targets are N(0, 1)) by at
    // most twice that. 1.6% is that worst case; the measured gap is below 0.15%.
    EXPECT_NEAR(loss, reference_loss.item<double>(), 2 * 4 * 0x1p-9 * reference_loss.item<double>()) << "step " << step;
  }
  expect_params_are_rounded_masters(amp, DType::bf16);
  EXPECT_EQ(hook_calls, 0) << "bf16 never checks for overflow (Colossal-AI's BF16MixedPrecisionMixin)";
  // The training moved each weight by d_f32 = w_f32 - w_0. The f32 masters integrate the same SGD on
  // gradients that carry the same ~4 roundings of 2^-9 (<= 0.8%), and ten small steps add little
  // trajectory drift, so the bf16 run's displacement must match f32's to 2% in norm per tensor
  // (measured: 0.5% at most).
  for (size_t k = 0; k < amp.master_params().size(); ++k) {
    const std::string& name = amp.param_names()[k];
    const Tensor moved = ops::sub(reference->parameter(name), initial->parameter(name));
    const Tensor error = ops::sub(amp.master_params()[k], reference->parameter(name));
    const double moved_norm = optim::vector_norm(moved).item<double>();
    const double error_norm = optim::vector_norm(error).item<double>();
    EXPECT_GT(moved_norm, 0.0);
    EXPECT_LE(error_norm, 0.02 * moved_norm) << name << ": moved " << moved_norm;
    EXPECT_GT(error_norm, 0.0) << "bf16 should not reproduce f32 exactly";
  }
}

TEST(MixedPrecisionOptimizer, StateRoundTripResumesBitExactly) {
  const auto build = [](uint64_t seed) {
    auto model = make_mlp(seed);
    auto sgd = make_sgd(*model, 0.05, 0.9);
    AmpOptions options = AmpOptions::for_mode(AmpMode::naive);
    options.scaler.growth_interval = 2;  // so the resumed steps include a growth
    return std::make_pair(sgd, std::make_shared<MixedPrecisionOptimizer>(model, sgd, options));
  };
  auto [sgd, amp] = build(11);
  EXPECT_TRUE(train_step(*amp, 0).stepped);
  forward_backward(*amp, 1);
  poison_first_grad(*amp, kInf);
  EXPECT_FALSE(amp->step().stepped);
  amp->zero_grad();
  EXPECT_TRUE(train_step(*amp, 2).stepped);

  const nn::StateDict model_state = [&] {
    nn::StateDict state;
    for (const auto& [name, tensor] : amp->model().state_dict()) state.insert(name, tensor.clone());
    return state;
  }();
  const optim::StateDict optimizer_state = clone_state(sgd->state_dict());
  const optim::StateDict amp_state = clone_state(amp->state_dict());
  EXPECT_EQ(amp_state.count("scaler.scale"), 1u);
  EXPECT_EQ(amp_state.count("master.0.weight"), 1u);
  EXPECT_EQ(amp_state.at("master.0.weight").dtype(), DType::f32);

  auto [resumed_sgd, resumed] = build(12);  // other initial weights, all overwritten by the load
  resumed->model().load_state_dict(model_state);
  resumed_sgd->load_state_dict(optimizer_state);
  resumed->load_state_dict(amp_state);
  expect_same_tensors(resumed->master_params(), amp->master_params(), "masters after the load");
  expect_params_are_rounded_masters(*resumed, DType::f16);

  for (int step = 3; step < 6; ++step) {
    const AmpStepResult a = train_step(*amp, step);
    const AmpStepResult b = train_step(*resumed, step);
    EXPECT_EQ(a.stepped, b.stepped);
    EXPECT_EQ(a.loss_scale, b.loss_scale);
    expect_same_tensors(resumed->master_params(), amp->master_params(), "masters after resumed steps");
    expect_same_tensors(resumed->model_params(), amp->model_params(), "model after resumed steps");
    EXPECT_EQ(resumed->scaler()->growth_tracker(), amp->scaler()->growth_tracker());
    EXPECT_EQ(resumed->scaler()->hysteresis_tracker(), amp->scaler()->hysteresis_tracker());
  }
}

TEST(MixedPrecisionOptimizer, LoadStateDictNamesTheBadKeyAndChangesNothing) {
  auto model = make_mlp(13);
  MixedPrecisionOptimizer amp(model, make_sgd(*model, 0.05), AmpOptions::for_mode(AmpMode::naive));
  const std::vector<Tensor> masters = clones(amp.master_params());
  const auto expect_error = [&](const optim::StateDict& state, const char* text) {
    try {
      amp.load_state_dict(state);
      ADD_FAILURE() << "expected an error mentioning " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
    expect_same_tensors(amp.master_params(), masters, "after a failed load");
    EXPECT_EQ(amp.loss_scale(), 65536.0);
  };
  optim::StateDict good = clone_state(amp.state_dict());
  good["scaler.scale"] = core::scalar_tensor(2.0, DType::f32);
  for (auto& [key, value] : good) {
    if (key.starts_with("master.")) value.fill_(7.0);
  }

  optim::StateDict state = good;
  state.erase("master.2.bias");
  expect_error(state, "'master.2.bias' is missing");
  state = good;
  state.erase("scaler.growth_tracker");
  expect_error(state, "'scaler.growth_tracker' is missing");
  state = good;
  state["master.2.weight"] = core::zeros({2, 2});
  expect_error(state, "'master.2.weight' has shape");
  state = good;
  state["master.9.weight"] = core::zeros({2, 2});
  expect_error(state, "'master.9.weight'");
  state = good;
  state["momentum"] = core::zeros({1});
  expect_error(state, "unexpected key 'momentum'");

  amp.load_state_dict(good);
  EXPECT_EQ(amp.loss_scale(), 2.0);
  expect_params_are_rounded_masters(amp, DType::f16);
  EXPECT_EQ(amp.model_params()[0].to_vector<float>()[0], 7.0f);
}

TEST(MixedPrecisionOptimizer, RejectsAnOptimizerOverOtherTensorsOrAModelNotInF32) {
  auto model = make_mlp(14);
  Tensor stranger = core::zeros({3});
  stranger.set_requires_grad(true);
  auto foreign = std::make_shared<optim::Sgd>(std::vector<Tensor>{stranger});
  EXPECT_THROW(
      {
        try {
          MixedPrecisionOptimizer amp(model, foreign, AmpOptions::for_mode(AmpMode::naive));
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("is not a parameter of the model"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);

  auto f64_model = make_mlp(15);
  f64_model->to(DType::f64);
  auto sgd = make_sgd(*f64_model, 0.1);
  EXPECT_THROW(
      {
        try {
          MixedPrecisionOptimizer amp(f64_model, sgd, AmpOptions::for_mode(AmpMode::bf16));
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("'0.weight' is f64; build the model in f32"), std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
}

TEST(MixedPrecisionOptimizer, CastsFloatingInputsToTheComputeDtypeAndOutputsToF32) {
  auto naive_model = make_mlp(16);
  MixedPrecisionOptimizer naive(naive_model, make_sgd(*naive_model, 0.1), AmpOptions::for_mode(AmpMode::naive));
  const Tensor x = random_batch(2, 4, 1);
  const Tensor ids = core::arange(0, 4);
  EXPECT_EQ(naive.cast_input(x).dtype(), DType::f16);
  EXPECT_EQ(naive.cast_input(ids).dtype(), DType::i64);
  EXPECT_EQ(naive.cast_output(naive.cast_input(x)).dtype(), DType::f32);
  EXPECT_EQ(naive.scale_loss(core::scalar_tensor(1.5, DType::f16)).dtype(), DType::f32);
  EXPECT_EQ(naive.scale_loss(core::scalar_tensor(1.5, DType::f16)).item<double>(), 1.5 * 65536);

  auto bf16_model = make_mlp(17);
  MixedPrecisionOptimizer bf16(bf16_model, make_sgd(*bf16_model, 0.1), AmpOptions::for_mode(AmpMode::bf16));
  EXPECT_EQ(bf16.cast_input(x).dtype(), DType::bf16);
  EXPECT_EQ(bf16.model_params()[0].dtype(), DType::bf16);
  EXPECT_EQ(bf16.scale_loss(core::scalar_tensor(1.5)).item<double>(), 1.5);

  auto torch_model = make_mlp(18);
  MixedPrecisionOptimizer torch(torch_model, make_sgd(*torch_model, 0.1), AmpOptions::for_mode(AmpMode::torch));
  EXPECT_TRUE(torch.cast_input(x).is_same(x));
  EXPECT_EQ(torch.model_params()[0].dtype(), DType::f32);
}

TEST(MixedPrecisionOptimizer, WrapsAnyOptimizerAndKeepsItsGroups) {
  auto model = make_mlp(19);
  optim::AdamOptions options;
  options.lr = 1e-2;
  auto adam = std::make_shared<optim::Adam>(optim::make_param_groups(model->named_parameters(), 0.1), options);
  MixedPrecisionOptimizer amp(model, adam, AmpOptions::for_mode(AmpMode::naive));
  ASSERT_EQ(adam->param_groups().size(), 2u);  // decay (weights) and no-decay (biases)
  EXPECT_EQ(adam->param_groups()[0].weight_decay(), 0.1);
  EXPECT_EQ(adam->param_groups()[1].names, (std::vector<std::string>{"0.bias", "2.bias"}));
  EXPECT_TRUE(train_step(amp, 0).stepped);
  expect_params_are_rounded_masters(amp, DType::f16);
  EXPECT_EQ(adam->state(0, 0).buffers.at("exp_avg").dtype(), DType::f32) << "optimizer state lives in f32";
}

}  // namespace
}  // namespace colossal::amp
