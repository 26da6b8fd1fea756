// The cases of Note [Update under the next forward] (engine/engine.cpp), run on the CPU by
// update_under_forward_test.cpp and on a GPU by update_under_forward_gpu_test.cpp: the same training
// with the update under the next forward and at the step's end, compared bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "colossal/amp/mixed_precision_optimizer.h"  // AmpOptions
#include "colossal/core/random.h"                    // Generator
#include "colossal/engine/engine.h"
#include "colossal/nn/activation.h"  // GELU
#include "colossal/nn/linear.h"
#include "colossal/nn/models/gpt2.h"
#include "colossal/ops/nn_functional.h"  // cross_entropy
#include "colossal/optim/adam.h"
#include "colossal/optim/lr_scheduler.h"

namespace colossal::engine::testing {

/// Linear layers held in a ModuleList; `direct` calls them through forward(), so that their forward
/// hooks never run (the model Note [Update under the next forward] must not update under the forward).
class LayerStack final : public nn::Module {
 public:
  LayerStack(bool direct, core::Generator* init) : Module("LayerStack"), direct_(direct) {
    auto layers = std::make_shared<nn::ModuleList>();
    for (int k = 0; k < 3; ++k) layers->push_back(std::make_shared<nn::Linear>(8, 8, true, init));
    layers_ = register_module("layers", layers);
    head_ = register_module("head", std::make_shared<nn::Linear>(8, 5, true, init));
  }
  Tensor forward(const Tensor& input) override {
    Tensor x = input;
    for (const auto& layer : *layers_) x = direct_ ? layer->forward(x) : (*layer)(x);
    return (*head_)(x);
  }

 private:
  bool direct_;
  std::shared_ptr<nn::ModuleList> layers_;
  std::shared_ptr<nn::Linear> head_;
};

enum class CaseModel { gpt2, stack, direct_stack };

struct CaseOptions {
  CaseModel model = CaseModel::gpt2;
  bool bf16 = true;
  bool clip = true;
  int64_t accumulation = 1;
  bool evaluate_between = false;  // an evaluation forward between two steps
};

struct CaseRun {
  std::vector<double> losses;
  std::vector<double> grad_norms;
  std::vector<std::vector<double>> params;  // read through Engine::model() right after the last step
  std::vector<std::vector<double>> masters;
  std::vector<double> evaluations;
  int64_t parts_waited = -1;  // -1: the Engine made no UpdateUnderForward
  size_t num_parts = 0;
};

inline CaseRun run_case(Device device, std::optional<bool> under_forward, const CaseOptions& c, int steps = 4) {
  core::Generator init(7), dropout(91);
  std::shared_ptr<nn::Module> model;
  if (c.model == CaseModel::gpt2) {
    nn::models::GPT2Config config;
    config.vocab_size = 61;
    config.n_positions = 16;
    config.n_embd = 32;
    config.n_layer = 3;
    config.n_head = 4;
    config.dropout = 0.1;
    model = std::make_shared<nn::models::GPT2>(config, &init, &dropout);
  } else {
    model = std::make_shared<LayerStack>(c.model == CaseModel::direct_stack, &init);
  }
  model->to(device);
  optim::AdamOptions adam;
  adam.lr = 3e-3;
  adam.weight_decay = 0.01;
  auto optimizer = std::make_shared<optim::AdamW>(optim::make_param_groups(model->named_parameters(), 0.01), adam);
  auto scheduler = std::make_shared<optim::CosineAnnealingLR>(*optimizer, 10);
  EngineOptions options;
  options.gradient_accumulation = c.accumulation;
  if (c.clip) options.clip_grad_norm = 0.05;  // small enough that the clip applies
  if (c.bf16) options.amp = amp::AmpOptions::for_mode(amp::AmpMode::bf16);
  options.update_under_forward = under_forward;
  const bool lm = c.model == CaseModel::gpt2;
  Engine engine(
      model, optimizer,
      [lm](const Tensor& out, const Tensor& y) {
        return lm ? nn::models::lm_cross_entropy(out, y) : ops::cross_entropy(out, y);
      },
      options, scheduler);
  engine.train();
  CaseRun run;
  core::Generator data(1234);
  auto batch = [&] {
    if (lm) {
      return std::pair{core::randint(0, 61, {2, 12}, DType::i64, &data).to(device),
                       core::randint(0, 61, {2, 12}, DType::i64, &data).to(device)};
    }
    return std::pair{core::randn({6, 8}, DType::f32, &data).to(device),
                     core::randint(0, 5, {6}, DType::i64, &data).to(device)};
  };
  for (int step = 0; step < steps * c.accumulation; ++step) {
    auto [x, y] = batch();
    run.losses.push_back(engine.step(x, y).item<double>());
    if (engine.last_step_updated() && c.clip) run.grad_norms.push_back(engine.last_grad_norm().value());
    if (c.evaluate_between && engine.last_step_updated()) {
      engine.eval();
      run.evaluations.push_back(
          engine.evaluate(batch().first).to(DType::f64).to(core::kCpu).view({-1}).narrow(0, 0, 1).item<double>());
      engine.train();
    }
  }
  for (const Tensor& p : engine.model().parameters()) run.params.push_back(p.to(DType::f64).to_vector<double>());
  if (engine.amp() != nullptr) {
    for (const Tensor& p : engine.amp()->master_params()) run.masters.push_back(p.to_vector<double>());
  }
  if (const UpdateUnderForward* u = engine.update_under_forward()) {
    run.parts_waited = u->parts_waited_in_hooks();
    run.num_parts = u->num_parts();
  }
  return run;
}

/// The run with the update under the next forward equals the run without, bit for bit; returns it.
inline CaseRun expect_same_as_at_the_step(Device device, const CaseOptions& c, int steps = 4) {
  const CaseRun on = run_case(device, true, c, steps);
  const CaseRun off = run_case(device, false, c, steps);
  EXPECT_EQ(on.losses, off.losses);
  EXPECT_EQ(on.grad_norms, off.grad_norms);
  EXPECT_EQ(on.params, off.params);
  EXPECT_EQ(on.masters, off.masters);
  EXPECT_EQ(on.evaluations, off.evaluations);
  EXPECT_EQ(off.parts_waited, -1) << "false makes no UpdateUnderForward";
  EXPECT_NE(on.losses.front(), on.losses.back()) << "the steps should train";
  return on;
}

}  // namespace colossal::engine::testing
