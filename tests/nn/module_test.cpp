// Module: registration and dotted naming, traversal order, tied parameters, Sequential and
// ModuleList, train/eval propagation, dtype conversion, zero_grad, state_dict round trips and every
// kind of load_state_dict error with its message.
#include <gtest/gtest.h>

#include "colossal/core/view.h"
#include "colossal/nn/activation.h"
#include "colossal/nn/batch_norm.h"
#include "colossal/nn/linear.h"
#include "colossal/nn/module.h"
#include "gradcheck.h"

namespace colossal {
namespace {

using nn::Module;
using testing::expect_close;

/// A two-level model shaped like GPT-2's attention naming: h.<i>.attn.c_attn.weight.
class Block : public Module {
 public:
  Block() : Module("Block") {
    attn = register_module("attn", std::make_shared<nn::Sequential>());
    c_attn = std::make_shared<nn::Conv1D>(4, 12);
    attn->push_back(c_attn);
    scale = &register_parameter("scale", core::full({4}, 0.5));
  }
  std::shared_ptr<nn::Sequential> attn;
  std::shared_ptr<nn::Conv1D> c_attn;
  Tensor* scale;
};

class Model : public Module {
 public:
  Model() : Module("Model") {
    register_parameter("wte", core::full({10, 4}, 0.25));
    h = register_module("h", std::make_shared<nn::ModuleList>());
    h->push_back(std::make_shared<Block>());
    h->push_back(std::make_shared<Block>());
    norm = register_module("norm", std::make_shared<nn::BatchNorm2d>(4));
  }
  std::shared_ptr<nn::ModuleList> h;
  std::shared_ptr<nn::BatchNorm2d> norm;
};

std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<std::string> out;
  for (const auto& [name, tensor] : named) out.push_back(name);
  return out;
}

TEST(Module, DottedNamesInRegistrationOrder) {
  Model model;
  // As in PyTorch: a module's own parameters come before its children's.
  const std::vector<std::string> expected = {"wte",       "h.0.scale",         "h.0.attn.0.weight", "h.0.attn.0.bias",
                                             "h.1.scale", "h.1.attn.0.weight", "h.1.attn.0.bias",   "norm.weight",
                                             "norm.bias"};
  EXPECT_EQ(names_of(model.named_parameters()), expected);
  EXPECT_EQ(names_of(model.named_buffers()),
            (std::vector<std::string>{"norm.running_mean", "norm.running_var", "norm.num_batches_tracked"}));
  EXPECT_EQ(names_of(model.named_parameters(/*recurse=*/false)), std::vector<std::string>{"wte"});
  // Parameters carry their full path for error messages, set as each level was registered.
  EXPECT_EQ(model.parameter("h.1.attn.0.weight").autograd_meta().name, "h.1.attn.0.weight");
  // 10*4 + 2 * (4*12 + 12 + 4) + 4 + 4
  EXPECT_EQ(model.num_parameters(), 40 + 2 * 64 + 8);
}

TEST(Module, NamedModulesAndChildren) {
  Model model;
  std::vector<std::string> names;
  for (const auto& [name, module] : model.named_modules()) names.push_back(name + ":" + module->type_name());
  EXPECT_EQ(names,
            (std::vector<std::string>{":Model", "h:ModuleList", "h.0:Block", "h.0.attn:Sequential", "h.0.attn.0:Conv1D",
                                      "h.1:Block", "h.1.attn:Sequential", "h.1.attn.0:Conv1D", "norm:BatchNorm2d"}));
  ASSERT_EQ(model.children().size(), 2u);
  EXPECT_EQ(model.named_children()[1].first, "norm");
  EXPECT_EQ(model.submodule("h.1.attn.0")->type_name(), "Conv1D");
  EXPECT_EQ(model.h->at<Block>(1)->c_attn.get(), model.submodule("h.1.attn.0").get());
  // apply visits children before their parent, as torch's Module.apply.
  std::vector<std::string> order;
  model.h->at<Block>(0)->apply([&](Module& m) { order.push_back(m.type_name()); });
  EXPECT_EQ(order, (std::vector<std::string>{"Conv1D", "Sequential", "Block"}));
}

TEST(Module, LookupErrorsSuggestNearestNames) {
  Model model;
  EXPECT_ERROR_CONTAINS(model.parameter("h.0.attn.0.weigth"), "nearest parameters: 'h.0.attn.0.weight'");
  EXPECT_ERROR_CONTAINS(model.submodule("h.2"), "has no submodule 'h.2'");
  EXPECT_ERROR_CONTAINS(model.buffer("norm.running_men"), "'norm.running_mean'");
  EXPECT_ERROR_CONTAINS(model.h->at<nn::Linear>(0), "is a Block, not the requested type");
  EXPECT_ERROR_CONTAINS((*model.h)[5], "index 5 out of range for 2 modules");
}

TEST(Module, RegistrationRejectsBadNames) {
  Module m("Custom");
  m.register_parameter("w", core::ones({2}));
  EXPECT_ERROR_CONTAINS(m.register_parameter("w", core::ones({2})), "'w': the name is already used");
  EXPECT_ERROR_CONTAINS(m.register_buffer("w", core::ones({2})), "'w': the name is already used");
  EXPECT_ERROR_CONTAINS(m.register_parameter("a.b", core::ones({2})), "must not contain '.'");
  EXPECT_ERROR_CONTAINS(m.register_parameter("", core::ones({2})), "must not be empty");
  EXPECT_ERROR_CONTAINS(m.register_parameter("ids", core::zeros({2}, DType::i64)), "must be floating, got i64");
  EXPECT_ERROR_CONTAINS(m.register_module("child", std::shared_ptr<Module>()), "cannot register a null module");
  EXPECT_ERROR_CONTAINS(m.forward(core::ones({2})), "Custom has no single-input forward()");
}

TEST(Module, ParametersAreTrainableLeavesAndAbsentOnesAreSkipped) {
  Module m;
  // A non-leaf value is detached so the parameter is a leaf of every graph that uses it.
  Tensor source = core::ones({3}, TensorOptions(DType::f32, core::kCpu, true));
  Tensor& p = m.register_parameter("p", ops::mul(source, 2.0));
  EXPECT_TRUE(p.is_leaf());
  EXPECT_TRUE(p.requires_grad());
  Tensor& frozen = m.register_parameter("frozen", core::ones({2}), /*requires_grad=*/false);
  EXPECT_FALSE(frozen.requires_grad());
  m.register_parameter("absent", Tensor());
  EXPECT_EQ(names_of(m.named_parameters()), (std::vector<std::string>{"p", "frozen"}));
  EXPECT_EQ(m.num_parameters(), 5);
  EXPECT_EQ(m.num_parameters(/*trainable_only=*/true), 3);
  EXPECT_FALSE(m.state_dict().contains("absent"));
}

TEST(Module, TiedParametersAppearOnce) {
  // GPT-2's lm_head shares wte's weight: one parameter, two state-dict entries (as torch).
  auto model = std::make_shared<Module>("Tied");
  auto wte = model->register_module("wte", std::make_shared<nn::Linear>(3, 5, false));
  auto head = model->register_module("head", std::make_shared<Module>("Head"));
  head->register_parameter("weight", wte->weight());
  EXPECT_EQ(names_of(model->named_parameters()), std::vector<std::string>{"wte.weight"});
  EXPECT_EQ(model->num_parameters(), 15);
  EXPECT_EQ(model->state_dict().keys(), (std::vector<std::string>{"wte.weight", "head.weight"}));
  model->to(DType::f64);  // conversion keeps the tie
  EXPECT_TRUE(model->parameter("head.weight").is_same(wte->weight()));
  EXPECT_EQ(wte->weight().dtype(), DType::f64);
}

TEST(Module, TrainEvalPropagates) {
  Model model;
  EXPECT_TRUE(model.is_training());
  model.eval();
  for (const auto& [name, module] : model.named_modules()) EXPECT_FALSE(module->is_training()) << name;
  model.h->train();
  EXPECT_FALSE(model.is_training());
  EXPECT_TRUE(model.submodule("h.1.attn.0")->is_training());
  EXPECT_FALSE(model.norm->is_training());
}

TEST(Module, ToDtypeConvertsFloatingStateAndKeepsTraining) {
  Model model;
  Tensor& w = model.parameter("h.0.attn.0.weight");
  w.set_grad(core::full(w.shape(), 0.5));
  const std::vector<double> before = w.to_vector<double>();
  model.to(DType::f64);
  Tensor& converted = model.parameter("h.0.attn.0.weight");
  EXPECT_EQ(converted.dtype(), DType::f64);
  EXPECT_TRUE(converted.requires_grad());
  EXPECT_TRUE(converted.is_leaf());
  EXPECT_EQ(converted.autograd_meta().name, "h.0.attn.0.weight");
  ASSERT_TRUE(converted.grad().defined());
  EXPECT_EQ(converted.grad().dtype(), DType::f64);
  EXPECT_EQ(converted.to_vector<double>(), before);  // f32 -> f64 is exact
  EXPECT_EQ(model.buffer("norm.running_var").dtype(), DType::f64);
  EXPECT_EQ(model.buffer("norm.num_batches_tracked").dtype(), DType::i64);  // integer buffers stay
  // The layer's own accessor sees the converted slot (Note [Parameter slots]).
  EXPECT_TRUE(model.h->at<Block>(0)->c_attn->weight().is_same(converted));
  // A no-op conversion keeps the handles.
  model.to(DType::f64);
  EXPECT_TRUE(model.parameter("h.0.attn.0.weight").is_same(converted));
  model.to(core::kCpu);
  EXPECT_TRUE(model.parameter("h.0.attn.0.weight").is_same(converted));
  EXPECT_ERROR_CONTAINS(model.to(DType::i32), "floating dtypes only");
}

TEST(Module, ConvertedParametersStillTrain) {
  nn::Linear layer(3, 2);
  layer.to(DType::f64);
  Tensor y = ops::sum(layer(testing::random_tensor({4, 3}, 1)));
  autograd::backward(y);
  ASSERT_TRUE(layer.weight().grad().defined());
  EXPECT_EQ(layer.weight().grad().dtype(), DType::f64);
  // d sum(x W^T + b) / db = number of rows
  testing::expect_values(layer.bias().grad(), {4.0, 4.0});
  layer.zero_grad(/*set_to_none=*/false);
  testing::expect_values(layer.bias().grad(), {0.0, 0.0});
  layer.zero_grad();
  EXPECT_FALSE(layer.bias().grad().defined());
}

TEST(Module, StateDictRoundTrip) {
  core::Generator gen_a(1), gen_b(2);
  nn::Sequential a({std::make_shared<nn::Linear>(4, 3, true, &gen_a), std::make_shared<nn::GELU>(),
                    std::make_shared<nn::Linear>(3, 2, true, &gen_a)});
  nn::Sequential b({std::make_shared<nn::Linear>(4, 3, true, &gen_b), std::make_shared<nn::GELU>(),
                    std::make_shared<nn::Linear>(3, 2, true, &gen_b)});
  const nn::StateDict state = a.state_dict();
  EXPECT_EQ(state.keys(), (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  // The entries alias the module's storage, detached from autograd.
  EXPECT_EQ(state.at("0.weight").raw_data(), a.parameter("0.weight").raw_data());
  EXPECT_FALSE(state.at("0.weight").requires_grad());

  const Tensor x = testing::random_tensor({5, 4}, 3, -1.0, 1.0, DType::f32);
  const nn::LoadResult result = b.load_state_dict(state);
  EXPECT_TRUE(result.missing_keys.empty() && result.unexpected_keys.empty());
  expect_close(b(x), a(x), 0.0, 0.0, "identical parameters give identical outputs");
  // Loading copies: b's storage is its own.
  EXPECT_NE(b.parameter("0.weight").raw_data(), a.parameter("0.weight").raw_data());
  EXPECT_TRUE(b.parameter("0.weight").requires_grad());

  // A state dict in another dtype is cast on load (checkpoints in f64 into an f32 model).
  nn::StateDict f64_state;
  for (const auto& [name, tensor] : state) f64_state.insert(name, core::cast_raw(tensor, DType::f64));
  nn::Sequential c(
      {std::make_shared<nn::Linear>(4, 3), std::make_shared<nn::GELU>(), std::make_shared<nn::Linear>(3, 2)});
  c.load_state_dict(f64_state);
  EXPECT_EQ(c.parameter("2.bias").dtype(), DType::f32);
  expect_close(c(x), a(x), 0.0, 0.0, "f32 -> f64 -> f32 is exact");
}

TEST(Module, StateDictHoldsPersistentBuffersOnly) {
  Module m("WithBuffers");
  m.register_buffer("kept", core::ones({2}));
  m.register_buffer("scratch", core::ones({2}), /*persistent=*/false);
  EXPECT_EQ(m.state_dict().keys(), std::vector<std::string>{"kept"});
  EXPECT_EQ(names_of(m.named_buffers()), (std::vector<std::string>{"kept", "scratch"}));
}

nn::StateDict state_of(const Module& m) {
  nn::StateDict out;
  for (const auto& [name, tensor] : m.state_dict()) out.insert(name, tensor.clone());
  return out;
}

TEST(Module, LoadStateDictReportsEveryProblemAndLoadsNothing) {
  Model model;
  nn::StateDict state = state_of(model);
  state.erase("h.1.scale");
  state.erase("norm.bias");
  state.insert("h.1.scal", core::ones({4}));
  state.insert("extra.weight", core::ones({1}));
  state.insert_or_assign("wte", core::ones({10, 5}));
  state.insert_or_assign("h.0.scale", core::full({4}, 7.0));

  const std::vector<double> before = model.parameter("h.0.scale").to_vector<double>();
  try {
    model.load_state_dict(state);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const char* part :
         {"load_state_dict into Model: 2 missing key(s), 2 unexpected key(s), 1 shape mismatch(es); nothing was loaded",
          "missing 'h.1.scale' (nearest in the state dict: 'h.1.scal')", "missing 'norm.bias'",
          "unexpected 'h.1.scal' (nearest in the module: 'h.1.scale')", "unexpected 'extra.weight'",
          "shape mismatch 'wte': state dict has [10, 5], module has [10, 4]", "strict=*/false"}) {
      EXPECT_NE(message.find(part), std::string::npos) << "message lacks \"" << part << "\":\n" << message;
    }
  }
  // Atomic: the valid entry h.0.scale = 7 was not copied either.
  EXPECT_EQ(model.parameter("h.0.scale").to_vector<double>(), before);
}

TEST(Module, LoadStateDictNonStrictReturnsKeys) {
  Model model;
  nn::StateDict state = state_of(model);
  state.erase("norm.weight");
  state.insert("unused", core::ones({1}));
  state.insert_or_assign("h.0.scale", core::full({4}, 7.0));
  const nn::LoadResult result = model.load_state_dict(state, /*strict=*/false);
  EXPECT_EQ(result.missing_keys, std::vector<std::string>{"norm.weight"});
  EXPECT_EQ(result.unexpected_keys, std::vector<std::string>{"unused"});
  testing::expect_values(model.parameter("h.0.scale"), {7, 7, 7, 7});
  // Shape mismatches are errors even when not strict (as torch).
  state.insert_or_assign("h.0.scale", core::ones({3}));
  EXPECT_ERROR_CONTAINS(model.load_state_dict(state, false),
                        "shape mismatch 'h.0.scale': state dict has [3], module has [4]");
}

TEST(Module, LoadStateDictHintsAtAPrefix) {
  // A checkpoint saved from a wrapper (Hugging Face's "transformer.", DDP's "module.").
  nn::Sequential model({std::make_shared<nn::Linear>(2, 2)});
  nn::StateDict prefixed;
  for (const auto& [name, tensor] : model.state_dict()) prefixed.insert("transformer." + name, tensor);
  EXPECT_ERROR_CONTAINS(model.load_state_dict(prefixed),
                        "every unexpected key is a missing key with the prefix 'transformer.'; strip it");
  EXPECT_ERROR_CONTAINS(model.load_state_dict(prefixed),
                        "missing '0.weight' (nearest in the state dict: 'transformer.0.weight')");
}

TEST(Module, SequentialChainsAndPrints) {
  core::Generator gen(5);
  auto first = std::make_shared<nn::Linear>(3, 4, true, &gen);
  auto second = std::make_shared<nn::Linear>(4, 2, false, &gen);
  nn::Sequential seq({first, std::make_shared<nn::ReLU>(), second});
  seq.push_back(std::make_shared<nn::Identity>());
  EXPECT_EQ(seq.size(), 4u);
  const Tensor x = testing::random_tensor({2, 3}, 6, -1.0, 1.0, DType::f32);
  expect_close(seq(x), ops::linear(ops::relu(ops::linear(x, first->weight(), first->bias())), second->weight()), 0.0,
               0.0, "Sequential is the composition");
  EXPECT_EQ(seq.to_string(),
            "Sequential(\n"
            "  (0): Linear(in_features=3, out_features=4, bias=true)\n"
            "  (1): ReLU()\n"
            "  (2): Linear(in_features=4, out_features=2, bias=false)\n"
            "  (3): Identity()\n"
            ")");
  EXPECT_EQ(nn::Sequential().forward(x).is_same(x), true);  // empty: the identity, as torch
}

TEST(StateDict, OrderLookupAndErrors) {
  nn::StateDict state;
  state.insert("b", core::ones({1}));
  state.insert("a", core::ones({2}));
  state.insert("c", core::ones({3}));
  EXPECT_EQ(state.keys(), (std::vector<std::string>{"b", "a", "c"}));
  EXPECT_ERROR_CONTAINS(state.insert("a", core::ones({1})), "duplicate key 'a'");
  EXPECT_TRUE(state.erase("a"));
  EXPECT_FALSE(state.erase("a"));
  EXPECT_EQ(state.at("c").numel(), 3);  // the index survives an erase
  EXPECT_ERROR_CONTAINS(state.at("cc"), "no key 'cc' (2 keys); did you mean c");
  EXPECT_EQ(nn::edit_distance("kitten", "sitting"), 3u);  // the textbook example
  EXPECT_EQ(nn::nearest_names("ln_f.weight", {"ln_f.bias", "transformer.ln_f.weight", "wte.weight"}).front(),
            "transformer.ln_f.weight");
  EXPECT_TRUE(nn::nearest_names("wpe.weight", {"h.0.mlp.c_fc.bias"}).empty());
}

}  // namespace
}  // namespace colossal
