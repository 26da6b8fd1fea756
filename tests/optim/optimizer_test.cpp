// The Optimizer base, through Sgd: which parameters skip weight decay and how make_param_groups
// splits a real module, group validation, zero_grad, the state_dict layout, and load_state_dict's
// refusals (each leaving the optimizer as it was).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "colossal/nn/transformer_block.h"
#include "colossal/optim/adam.h"
#include "colossal/optim/lamb.h"
#include "colossal/optim/sgd.h"
#include "gradcheck.h"  // expect_values, EXPECT_ERROR_CONTAINS
#include "optim_test_util.h"

namespace colossal::optim {
namespace {

using colossal::testing::expect_values;
using testing::make_param;
using testing::set_grad;

std::vector<std::string> names_of(const ParamGroup& group) {
  return group.names;
}

TEST(DefaultNoWeightDecay, BiasesNormsAndVectorsSkipDecay) {
  const Tensor matrix = core::zeros({2, 2}, DType::f64);
  const Tensor vector = core::zeros({2}, DType::f64);
  EXPECT_FALSE(default_no_weight_decay("fc.weight", matrix));
  EXPECT_FALSE(default_no_weight_decay("blocks.0.mlp.fc1.weight", matrix));
  EXPECT_FALSE(default_no_weight_decay("patch_embed.proj.weight", core::zeros({4, 3, 2, 2}, DType::f64)));
  EXPECT_TRUE(default_no_weight_decay("fc.bias", vector));
  EXPECT_TRUE(default_no_weight_decay("norm1.weight", vector));
  EXPECT_TRUE(default_no_weight_decay("anything", vector));                          // every 1-D parameter
  EXPECT_TRUE(default_no_weight_decay("logit_scale", core::zeros({}, DType::f64)));  // and 0-d
  // By name, whatever the rank:
  EXPECT_TRUE(default_no_weight_decay("attn.relative_position_bias", matrix));  // ends in bias
  EXPECT_TRUE(default_no_weight_decay("encoder.LayerNorm.weight", matrix));     // a component with "norm"
  EXPECT_TRUE(default_no_weight_decay("bn_NORM.weight", matrix));               // any case
  EXPECT_TRUE(default_no_weight_decay("h.0.ln_1.weight", matrix));              // GPT-2's ln_1
  EXPECT_TRUE(default_no_weight_decay("ln_f.weight", matrix));
  EXPECT_FALSE(default_no_weight_decay("kln.weight", matrix));  // "ln" only as a component's start
}

TEST(MakeParamGroups, SplitsATransformerBlockIntoDecayAndNoDecay) {
  nn::TransformerBlock block(8, 2);
  const std::vector<ParamGroup> groups = make_param_groups(block.named_parameters(), 0.05);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(names_of(groups[0]),
            (std::vector<std::string>{"attn.qkv.weight", "attn.proj.weight", "mlp.fc1.weight", "mlp.fc2.weight"}));
  EXPECT_EQ(names_of(groups[1]),
            (std::vector<std::string>{"norm1.weight", "norm1.bias", "attn.qkv.bias", "attn.proj.bias", "norm2.weight",
                                      "norm2.bias", "mlp.fc1.bias", "mlp.fc2.bias"}));
  EXPECT_EQ(groups[0].options, (std::map<std::string, double>{{"weight_decay", 0.05}}));
  EXPECT_EQ(groups[1].options, (std::map<std::string, double>{{"weight_decay", 0.0}}));
  for (const ParamGroup& group : groups) {
    ASSERT_EQ(group.params.size(), group.names.size());
    for (const Tensor& p : group.params) EXPECT_TRUE(p.requires_grad());
  }

  // Handed to an optimizer, every other option takes its default.
  AdamW adamw(groups, {.lr = 0.01});
  EXPECT_EQ(adamw.param_groups()[0].weight_decay(), 0.05);
  EXPECT_EQ(adamw.param_groups()[1].weight_decay(), 0.0);
  EXPECT_EQ(adamw.param_groups()[1].lr(), 0.01);
}

TEST(MakeParamGroups, LeavesOutFrozenParametersAndEmptyGroups) {
  Tensor weight = make_param({1.0, 2.0, 3.0, 4.0}, {2, 2});
  Tensor bias = make_param({0.0, 0.0});
  Tensor frozen = make_param({1.0, 2.0, 3.0, 4.0}, {2, 2});
  frozen.set_requires_grad(false);
  std::vector<ParamGroup> groups = make_param_groups({{"fc.weight", weight}, {"frozen.weight", frozen}}, 0.1);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(names_of(groups[0]), std::vector<std::string>{"fc.weight"});
  EXPECT_EQ(groups[0].weight_decay(), 0.1);
  groups = make_param_groups({{"fc.bias", bias}}, 0.1);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].weight_decay(), 0.0);
}

TEST(MakeParamGroups, TakesACustomRule) {
  Tensor embedding = make_param({1.0, 2.0, 3.0, 4.0}, {2, 2});
  Tensor fc = make_param({1.0, 2.0, 3.0, 4.0}, {2, 2});
  const auto groups = make_param_groups({{"wte.weight", embedding}, {"fc.weight", fc}}, 0.1,
                                        [](const std::string& name, const Tensor&) { return name.starts_with("wte"); });
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(names_of(groups[0]), std::vector<std::string>{"fc.weight"});
  EXPECT_EQ(names_of(groups[1]), std::vector<std::string>{"wte.weight"});
}

TEST(MakeParamGroups, RejectsBadArguments) {
  Tensor p = make_param({1.0});
  EXPECT_ERROR_CONTAINS(make_param_groups({{"p", p}}, -0.1), "make_param_groups: weight_decay must be >= 0, got -0.1");
  EXPECT_ERROR_CONTAINS(make_param_groups({{"missing", Tensor()}}, 0.1),
                        "make_param_groups: parameter 'missing' is an undefined tensor");
}

TEST(Optimizer, RejectsBadParameterLists) {
  Tensor p = make_param({1.0});
  EXPECT_ERROR_CONTAINS(Sgd(std::vector<ParamGroup>{}), "SGD: needs at least one param group");
  EXPECT_ERROR_CONTAINS(Sgd({ParamGroup{.params = {p}}, ParamGroup{.params = {p}, .names = {"fc.weight"}}}),
                        "SGD: param group 1: parameter 'fc.weight' appears more than once across the param groups");
  EXPECT_ERROR_CONTAINS(Sgd({ParamGroup{.params = {p}, .names = {"a", "b"}}}),
                        "names must be empty or one per parameter: 2 names for 1 parameters");
  EXPECT_ERROR_CONTAINS(Sgd({core::zeros({2}, DType::i64)}),
                        "parameter #0 has dtype i64; only floating tensors can be optimized");
}

TEST(Optimizer, AddParamGroupFillsDefaultsAndRejectsDuplicates) {
  Tensor a = make_param({1.0});
  Tensor b = make_param({1.0});
  Sgd sgd({a}, {.lr = 0.1, .momentum = 0.9});
  sgd.add_param_group(ParamGroup{.params = {b}, .options = {{"lr", 0.01}}});
  ASSERT_EQ(sgd.param_groups().size(), 2u);
  EXPECT_EQ(sgd.param_groups()[1].lr(), 0.01);
  EXPECT_EQ(sgd.param_groups()[1].get("momentum"), 0.9);
  EXPECT_ERROR_CONTAINS(sgd.add_param_group(ParamGroup{.params = {a}}), "appears more than once");
  EXPECT_ERROR_CONTAINS(sgd.add_param_group(ParamGroup{.params = {make_param({1.0})}, .options = {{"lr", -1.0}}}),
                        "SGD: param group 2: lr must be a finite number >= 0, got -1");
  EXPECT_EQ(sgd.param_groups().size(), 2u);
}

TEST(Optimizer, ZeroGrad) {
  Tensor a = make_param({1.0, 2.0});
  Sgd sgd({a});
  set_grad(a, {3.0, 4.0});
  sgd.zero_grad(/*set_to_none=*/false);
  ASSERT_TRUE(a.grad().defined());
  expect_values(a.grad(), {0.0, 0.0}, 0.0);
  sgd.zero_grad();
  EXPECT_FALSE(a.grad().defined());
}

/// Two groups, three parameters (global indices 0 | 1, 2); only 0 and 2 have been stepped.
struct Stepped {
  Tensor a = make_param({1.0, 2.0});
  Tensor b = make_param({3.0});
  Tensor c = make_param({4.0, 5.0, 6.0});
  Sgd sgd{{ParamGroup{.params = {a}}, ParamGroup{.params = {b, c}, .options = {{"lr", 0.5}}}},
          {.lr = 0.1, .momentum = 0.9}};
  Stepped() {
    set_grad(a, {1.0, 1.0});
    set_grad(c, {1.0, 2.0, 3.0});
    sgd.step();
  }
};

TEST(Optimizer, StateDictLayout) {
  Stepped s;
  const StateDict state = s.sgd.state_dict();
  std::vector<std::string> keys;
  for (const auto& [key, tensor] : state) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "param_groups.0.dampening", "param_groups.0.lr", "param_groups.0.momentum",
                      "param_groups.0.nesterov", "param_groups.0.params", "param_groups.0.weight_decay",
                      "param_groups.1.dampening", "param_groups.1.lr", "param_groups.1.momentum",
                      "param_groups.1.nesterov", "param_groups.1.params", "param_groups.1.weight_decay",
                      "state.0.momentum_buffer", "state.0.step", "state.2.momentum_buffer", "state.2.step"}));
  EXPECT_EQ(state.at("param_groups.1.params").to_vector<int64_t>(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(state.at("param_groups.1.lr").item<double>(), 0.5);
  EXPECT_EQ(state.at("state.2.step").dtype(), DType::i64);
  expect_values(state.at("state.2.momentum_buffer"), {1.0, 2.0, 3.0}, 0.0);
}

TEST(Optimizer, LoadStateDictRefusesMismatchesAndKeepsItsState) {
  Stepped source;
  const StateDict good = source.sgd.state_dict();
  Stepped target;
  target.sgd.param_groups()[0].set_lr(0.25);
  auto expect_refused = [&](StateDict state, const std::string& message) {
    EXPECT_ERROR_CONTAINS(target.sgd.load_state_dict(state), message);
    EXPECT_EQ(target.sgd.param_groups()[0].lr(), 0.25) << message;
    EXPECT_EQ(target.sgd.state(0, 0).step, 1) << message;
  };
  StateDict state = good;
  state.erase("param_groups.1.momentum");
  expect_refused(state, "SGD: load_state_dict: missing key 'param_groups.1.momentum'");
  state = good;
  state["param_groups.2.lr"] = core::scalar_tensor(0.1, DType::f64);
  expect_refused(state, "key 'param_groups.2.lr' names param group 2, but this optimizer has 2 group(s)");
  state = good;
  state["param_groups.1.params"] = core::from_vector<int64_t>({1}, {1});
  expect_refused(state, "param group 1 was saved with 1 parameter(s)");
  state = good;
  state["state.2.momentum_buffer"] = core::zeros({2}, DType::f64);
  expect_refused(state, "key 'state.2.momentum_buffer' has shape [2], but parameter #1 of group 1 has shape [3]");
  state = good;
  state["state.7.step"] = core::scalar_tensor(1.0, DType::i64);
  expect_refused(state, "key 'state.7.step' names parameter 7, but this optimizer has 3 parameter(s)");
  state = good;
  state.erase("state.2.step");
  expect_refused(state, "missing key 'state.2.step'");
  state = good;
  state["param_groups.0.lr"] = core::scalar_tensor(-1.0, DType::f64);
  expect_refused(state, "SGD: param group 0: lr must be a finite number >= 0, got -1");
  state = good;
  state["momentum"] = core::scalar_tensor(0.9, DType::f64);
  expect_refused(state, "unexpected key 'momentum'");

  target.sgd.load_state_dict(good);  // and the good one still loads
  EXPECT_EQ(target.sgd.param_groups()[0].lr(), 0.1);
}

TEST(Optimizer, LoadStateDictCopiesBuffersToTheParametersDtype) {
  Tensor a = make_param({1.0, 2.0});
  Sgd source({a}, {.lr = 0.1, .momentum = 0.9});
  set_grad(a, {0.5, 0.25});
  source.step();
  Tensor b = core::from_vector<float>({1.0f, 2.0f}, {2});
  b.set_requires_grad(true);
  Sgd target({b}, {.lr = 0.1, .momentum = 0.9});
  const StateDict saved = source.state_dict();
  target.load_state_dict(saved);
  const Tensor buffer = target.state(0, 0).buffers.at("momentum_buffer");
  EXPECT_EQ(buffer.dtype(), DType::f32);
  expect_values(buffer, {0.5, 0.25}, 0.0);
  // A copy, not an alias: stepping the source does not move the target's buffer.
  set_grad(a, {1.0, 1.0});
  source.step();
  expect_values(buffer, {0.5, 0.25}, 0.0);
}

TEST(MultiTensorCopy, ConvertsEveryPairAndRefusesMismatches) {
  // f32 -> bf16 rounds to nearest even (1 + 2^-8 is a tie: down to 1; 1 + 3 * 2^-9 rounds up to
  // 1 + 2^-7), bf16 -> f32 is exact, f64 -> f32 rounds; tensors of different dtype pairs in one call.
  const std::vector<double> values = {1.0, 1.0 + std::ldexp(1.0, -8), 1.0 + 3 * std::ldexp(1.0, -9), -2.5};
  const Tensor f32 = core::from_vector(values, {2, 2}).to(DType::f32);
  Tensor to_bf16 = core::empty({2, 2}, TensorOptions(DType::bf16));
  Tensor back = core::empty({2, 2}, TensorOptions(DType::f32));
  const Tensor bf16 = core::from_vector(std::vector<double>{0.5, -3.0, 7.0}, {3}).to(DType::bf16);
  Tensor f64_dst = core::empty({3}, TensorOptions(DType::f64));
  multi_tensor_copy({to_bf16, f64_dst}, {f32, bf16});
  expect_values(to_bf16.to(DType::f64), {1.0, 1.0, 1.0 + std::ldexp(1.0, -7), -2.5});
  expect_values(f64_dst, {0.5, -3.0, 7.0});
  multi_tensor_copy({back}, {to_bf16});
  expect_values(back.to(DType::f64), {1.0, 1.0, 1.0 + std::ldexp(1.0, -7), -2.5});
  multi_tensor_copy({}, {});  // nothing to do

  EXPECT_ERROR_CONTAINS(multi_tensor_copy({back}, {}), "1 destinations for 0 sources");
  EXPECT_ERROR_CONTAINS(multi_tensor_copy({back}, {bf16}), "tensor 0: destination [2, 2] and source [3] differ");
  // A strided destination is copied element by element to the same places.
  Tensor square = core::empty({2, 2}, TensorOptions(DType::f32));
  multi_tensor_copy({square.transpose(0, 1)}, {f32});
  expect_values(square.to(DType::f64), {1.0, 1.0 + 3 * std::ldexp(1.0, -9), 1.0 + std::ldexp(1.0, -8), -2.5});
}

}  // namespace
}  // namespace colossal::optim

namespace colossal::optim {
namespace {

using testing::make_param;
using testing::set_grad;

// ---- step_next_in_parts (Note [Update under the next forward] in engine/engine.cpp)

/// Three parameters with gradients and a fourth without one, for an optimizer stepped twice.
struct Parts {
  std::vector<Tensor> params{make_param({0.5, -1.0, 1.5, 2.0}, {2, 2}), make_param({0.25, -0.75}),
                             make_param({1.0, 2.0, -3.0}), make_param({4.0})};
  void set_grads(int step) {
    const double s = 1.0 + 0.5 * step;
    set_grad(params[0], {0.1 * s, -0.2, 0.3, -0.4 * s});
    set_grad(params[1], {0.05, -0.15 * s});
    set_grad(params[2], {-0.3 * s, 0.2, 0.7});
  }
  std::vector<std::vector<double>> values() const {
    std::vector<std::vector<double>> out;
    for (const Tensor& p : params) out.push_back(p.to_vector<double>());
    return out;
  }
};

using MakeOn = std::function<std::unique_ptr<Optimizer>(const std::vector<Tensor>& params)>;

void expect_parts_equal_one_step(const MakeOn& make, bool scale) {
  Parts whole, parted;
  std::unique_ptr<Optimizer> a = make(whole.params), b = make(parted.params);
  for (int step = 0; step < 3; ++step) {
    whole.set_grads(step);
    parted.set_grads(step);
    if (scale) {
      a->scale_gradients_in_next_step(core::full({}, 0.625, DType::f64));
      b->scale_gradients_in_next_step(core::full({}, 0.625, DType::f64));
    }
    a->step();
    std::vector<size_t> order;
    // Parameter 3 has no gradient: in a part, it is skipped as step() skips it.
    b->step_next_in_parts({{parted.params[2]}, {parted.params[0], parted.params[3]}, {}, {parted.params[1]}},
                          [&](size_t part) { order.push_back(part); });
    b->step();
    EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3}));
    // The gradients are back where they were.
    EXPECT_TRUE(parted.params[0].grad().defined() && parted.params[1].grad().defined());
    EXPECT_EQ(whole.values(), parted.values()) << "step " << step;
    // The parts are for one step: the next is whole again.
    whole.set_grads(step);
    parted.set_grads(step);
    a->step();
    b->step();
    EXPECT_EQ(whole.values(), parted.values()) << "step " << step << " after the parted one";
  }
  EXPECT_EQ(a->state_dict().size(), b->state_dict().size());
}

TEST(OptimizerStepInParts, EachOptimizerStepsTheNumbersOfOneStep) {
  for (bool scale : {false, true}) {
    SCOPED_TRACE(scale ? "with a gradient scale" : "without a scale");
    expect_parts_equal_one_step(
        [](const std::vector<Tensor>& p) {
          AdamOptions o;
          o.lr = 0.1;
          o.weight_decay = 0.01;
          return std::make_unique<AdamW>(p, o);
        },
        scale);
    expect_parts_equal_one_step(
        [](const std::vector<Tensor>& p) {
          SgdOptions o;
          o.lr = 0.1;
          o.momentum = 0.9;
          return std::make_unique<Sgd>(p, o);
        },
        scale);
    expect_parts_equal_one_step(
        [](const std::vector<Tensor>& p) {
          LambOptions o;
          o.lr = 0.05;
          o.weight_decay = 0.01;
          return std::make_unique<Lamb>(p, o);
        },
        scale);
  }
}

TEST(OptimizerStepInParts, BadPartsAreClearErrors) {
  Parts parts;
  parts.set_grads(0);
  AdamW adam(parts.params);
  const Tensor stranger = make_param({1.0});
  EXPECT_ERROR_CONTAINS(adam.step_next_in_parts({{parts.params[0]}, {stranger}}, {}),
                        "tensor 0 of part 1 is not a parameter of this optimizer");
  EXPECT_ERROR_CONTAINS(adam.step_next_in_parts({{parts.params[0]}, {parts.params[1], parts.params[0]}}, {}),
                        "parameter #0 is in part 0 and in part 1");
  // A parameter with a gradient in no part is named at the step, and nothing has moved.
  const std::vector<std::vector<double>> before = parts.values();
  adam.step_next_in_parts({{parts.params[0]}, {parts.params[1]}}, {});
  EXPECT_ERROR_CONTAINS(adam.step(), "parameter #2 has a gradient but is in no part");
  EXPECT_EQ(parts.values(), before);
  EXPECT_TRUE(parts.params[1].grad().defined());
  // zero_grad forgets the parts.
  adam.step_next_in_parts({{parts.params[0]}}, {});
  adam.zero_grad();
  parts.set_grads(1);
  adam.step();  // whole
  EXPECT_NE(parts.values(), before);
}

}  // namespace
}  // namespace colossal::optim
