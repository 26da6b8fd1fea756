// The layout-equivalence harness: see layout_harness.h.
//
// Tolerance (f32, the default 1e-5, relative by norm): the serial and the data-parallel run compute
// the same sums in another order (a mean over the global batch against per-rank means averaged by
// an all-reduce, partial gradients summed per rank first), which leaves ~1e-7 relative differences
// per step; a few AdamW steps, whose m / sqrt(v) can amplify a relative error where v is small, keep
// them well under 1e-5, while a wrong scaling (a sum for a mean, a micro-step missed or counted
// twice, a rank's share dropped) is off by 10% or more. 16-bit cases pass their own tolerance,
// justified where they are declared.
//
// The default optimizer is SGD with momentum, whose update is proportional to the gradient, so a
// parameter differs from the serial one as much as its gradients did. AdamW divides by sqrt(v): a
// parameter whose gradient is zero up to rounding (the key bias of attention, which adds the same
// score to every key and so cancels in the softmax) gets a full-size update of the rounding noise's
// sign, and such parameters differ by ~1e-4 between any two summation orders. AdamW is checked on
// the MLP, whose gradients are all well away from zero (HarnessCase::make_optimizer).
#include "layout_harness.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include <fmt/format.h>

#include "colossal/amp/mixed_precision_optimizer.h"
#include "colossal/core/error.h"
#include "colossal/nn/activation.h"
#include "colossal/nn/linear.h"
#include "colossal/nn/models/gpt2.h"
#include "colossal/nn/models/vit.h"
#include "colossal/ops/nn_functional.h"
#include "colossal/ops/shape.h"
#include "colossal/optim/adam.h"
#include "colossal/optim/sgd.h"
#include "colossal/parallel/parallel_context.h"
#include "colossal/parallel/tp/cross_entropy.h"
#include "colossal/parallel/tp/gpt2_1d.h"
#include "colossal/parallel/tp/gpt2_plan.h"
#include "colossal/parallel/tp/shard_spec.h"
#include "colossal/parallel/tp/vit_1d.h"
#include "colossal/parallel/tp/vit_plan.h"
#include "colossal/parallel/zero/low_level_zero.h"

namespace colossal::testing {
namespace {

using Values = std::map<std::string, std::vector<double>>;

std::vector<double> host_f64(const Tensor& t) {
  return t.detach().to(Device{}).to(DType::f64).contiguous().to_vector<double>();
}

double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-12);
}

/// What one run recorded at each update: the micro-steps' losses, the gradients the update used,
/// the parameters after it.
struct Trace {
  std::vector<std::vector<double>> losses;
  std::vector<Values> grads, params;
  std::vector<bool> skipped;  // per update: skipped for an fp16 overflow
};

std::optional<amp::AmpOptions> amp_options(Precision p) {
  switch (p) {
    case Precision::f32:
      return std::nullopt;
    case Precision::bf16:
      return amp::AmpOptions::for_mode(amp::AmpMode::bf16);
    case Precision::fp16:
      return amp::AmpOptions::for_mode(amp::AmpMode::naive);
  }
  return std::nullopt;
}

/// Trains c for c.steps updates on rows [share * rank, share * (rank + 1)) of each global batch,
/// through an Engine over `context` (null: serial).
Trace run(const HarnessCase& c, std::shared_ptr<const parallel::ParallelContext> context, Device device, int64_t rank,
          int64_t share, std::optional<parallel::zero::ZeroOptions> zero = std::nullopt) {
  core::Generator init(1234);
  std::shared_ptr<nn::Module> model = c.build_model(init);
  model->to(device);
  const bool tensor_parallel = context && context->layout().tensor_size() > 1;
  std::map<std::string, parallel::tp::ShardSpec> specs;
  std::shared_ptr<comm::ProcessGroup> tensor_group;
  engine::Criterion criterion = c.criterion;
  if (tensor_parallel) {
    model = c.parallelize(*model, *context);
    specs = parallel::tp::collect_shard_specs(*model);
    tensor_group = context->group(parallel::GroupKind::kTensor);
    if (c.parallel_criterion) criterion = c.parallel_criterion(*context);
  }
  // A tensor-parallel rank's value of a parameter (or gradient) as the serial tensor: its shard
  // gathered over the tensor group (every rank gathers the same names in the same order).
  const auto whole = [&](const std::string& name, const Tensor& t) {
    return tensor_parallel ? parallel::tp::gather_shard(t, specs.at(name), *tensor_group) : t;
  };
  std::shared_ptr<optim::Optimizer> optimizer;
  if (c.make_optimizer) {
    optimizer = c.make_optimizer(*model);
  } else {
    optimizer = std::make_shared<optim::Sgd>(model->parameters(), optim::SgdOptions{.lr = 0.05, .momentum = 0.9});
  }
  Trace trace;
  engine::EngineOptions options;
  options.context = std::move(context);
  options.gradient_accumulation = c.accumulation;
  options.clip_grad_norm = c.clip;
  options.amp = amp_options(c.precision);
  if (options.amp && c.scaler) options.amp->scaler = *c.scaler;
  options.zero = zero;
  options.before_update = [&trace, &whole](engine::Engine& e) {
    Values grads;
    if (parallel::zero::ZeroHandler* z = e.zero()) {
      // Each rank holds its shard's gradients: gathered whole (f32), as the update uses them.
      // Under tensor parallelism that is this tensor rank's tensor: gathered over the tensor group too.
      for (const auto& [name, g] : z->gather_gradients()) grads[name] = host_f64(whole(name, g));
      trace.grads.push_back(std::move(grads));
      return;
    }
    for (const auto& [name, p] : e.model().named_parameters()) {
      if (p.grad().defined()) grads[name] = host_f64(whole(name, p.grad()));
    }
    trace.grads.push_back(std::move(grads));
  };
  engine::Engine engine(model, optimizer, criterion, options);
  for (int64_t step = 0; step < c.steps; ++step) {
    std::vector<double> losses;
    for (int64_t micro = 0; micro < c.accumulation; ++micro) {
      auto [x, y] = c.rows(step, micro, rank * share, (rank + 1) * share);
      losses.push_back(engine.step(x.to(device), y.to(device)).to(Device{}).item<double>());
    }
    trace.losses.push_back(std::move(losses));
    trace.skipped.push_back(engine.last_step_skipped());
    Values params;
    if (parallel::zero::ZeroHandler* z = engine.zero(); z != nullptr && z->stage() == 3) {
      // ZeRO-3's parameters are shards between uses: gathered whole by name (over the data group),
      // then over the tensor group as any tensor-parallel parameter.
      const nn::StateDict state = z->gather_model_state(engine.model().state_dict());
      for (const auto& [name, p] : engine.model().named_parameters())
        params[name] = host_f64(whole(name, state.at(name)));
    } else {
      for (const auto& [name, p] : engine.model().named_parameters()) params[name] = host_f64(whole(name, p));
    }
    trace.params.push_back(std::move(params));
  }
  return trace;
}

void compare(const std::string& where, const Values& got, const Values& want, double tolerance, double& worst,
             std::string& worst_name, int64_t& count, int64_t step) {
  EXPECT_EQ(got.size(), want.size()) << where << ": the runs have different tensors at step " << step;
  for (const auto& [name, values] : want) {
    auto it = got.find(name);
    if (it == got.end()) {
      ADD_FAILURE() << where << ": step " << step << ": " << name << " is missing from the layout run";
      continue;
    }
    const double error = relative_error(it->second, values);
    ++count;
    if (error > worst) {
      worst = error;
      worst_name = fmt::format("step {} {}", step, name);
    }
    EXPECT_LE(error, tolerance) << where << ": step " << step << ": " << name << " differs by " << error
                                << " (relative, by norm)";
  }
}

}  // namespace

std::string Layout::name() const {
  std::string name = tensor == 1 ? fmt::format("dp{}", data)
                     : data == 1 ? fmt::format("tp{}", tensor)
                                 : fmt::format("dp{}_tp{}", data, tensor);
  if (zero > 0) name += fmt::format("_zero{}", zero);
  if (zero_offload) name += "_offload";
  if (zero == 3) {
    name += zero_placement == parallel::zero::Placement::cuda  ? "_cuda"
            : zero_placement == parallel::zero::Placement::cpu ? "_cpu"
                                                               : "_auto";
  }
  return name;
}

HarnessReport expect_layout_matches_serial(const HarnessCase& c, const Layout& layout,
                                           const std::shared_ptr<comm::ProcessGroup>& world) {
  HarnessReport report;
  const std::string where = fmt::format("{} {} ({} ranks)", c.name, layout.name(), world->size());
  config::ParallelConfig pc;
  pc.data = layout.data;
  pc.tensor.size = layout.tensor;
  if (layout.tensor > 1 && !c.parallelize) {
    ADD_FAILURE() << where << ": a tensor-parallel layout needs HarnessCase::parallelize";
    return report;
  }
  auto context = std::make_shared<const parallel::ParallelContext>(parallel::ParallelContext::create(pc, world));
  const int dp = context->size(parallel::GroupKind::kData);
  if (c.global_batch % dp != 0) {
    ADD_FAILURE() << where << ": global batch " << c.global_batch << " does not split over " << dp << " ranks";
    return report;
  }
  const Device device = world->device();
  const Trace serial = run(c, nullptr, device, 0, c.global_batch);
  std::optional<parallel::zero::ZeroOptions> zero;
  if (layout.zero > 0) {
    zero = parallel::zero::ZeroOptions{.stage = layout.zero,
                                       .reduce_bucket_bytes = layout.zero_bucket_bytes,
                                       .granularity = layout.zero_granularity,
                                       .chunk_bytes = layout.zero_chunk_bytes,
                                       .placement = layout.zero_placement,
                                       .device_budget_bytes = layout.zero_device_budget_bytes};
  }
  if (zero) zero->offload_optimizer = layout.zero_offload;
  const Trace parallel = run(c, context, device, context->rank(parallel::GroupKind::kData), c.global_batch / dp, zero);

  report.skipped_steps = std::count(parallel.skipped.begin(), parallel.skipped.end(), true);
  EXPECT_EQ(parallel.skipped, serial.skipped) << where << ": the updates skipped for fp16 overflows differ";
  for (int64_t step = 0; step < c.steps; ++step) {
    const auto s = static_cast<size_t>(step);
    for (size_t m = 0; m < serial.losses[s].size(); ++m) {
      const double want = serial.losses[s][m], got = parallel.losses[s][m];
      const double error = std::abs(got - want) / std::max(std::abs(want), 1e-12);
      report.loss = std::max(report.loss, error);
      EXPECT_LE(error, c.tolerance) << where << ": step " << step << " micro-step " << m << ": loss " << got
                                    << ", serial " << want;
    }
    if (parallel.grads.size() != serial.grads.size()) {
      ADD_FAILURE() << where << ": " << parallel.grads.size() << " updates against the serial run's "
                    << serial.grads.size();
      return report;
    }
    // A skipped update's gradients overflowed (inf / NaN); that both runs skipped it is the check.
    if (!serial.skipped[s]) {
      compare(where + " gradient", parallel.grads[s], serial.grads[s], c.tolerance, report.grad, report.worst_grad,
              report.compared_tensors, step);
    }
    compare(where + " parameter", parallel.params[s], serial.params[s], c.tolerance, report.param, report.worst_param,
            report.compared_tensors, step);
  }
  return report;
}

// ---- shared cases

HarnessCase mlp_case() {
  HarnessCase c;
  c.name = "mlp";
  static constexpr int64_t kIn = 6, kHidden = 16, kClasses = 3;
  c.build_model = [](core::Generator& init) -> std::shared_ptr<nn::Module> {
    return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(kIn, kHidden, true, &init), std::make_shared<nn::GELU>(),
        std::make_shared<nn::Linear>(kHidden, kClasses, true, &init)});
  };
  c.rows = [](int64_t step, int64_t micro, int64_t begin, int64_t end) {
    std::vector<float> x;
    std::vector<int64_t> y;
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t f = 0; f < kIn; ++f) {
        x.push_back(static_cast<float>(std::sin(0.7 * static_cast<double>(r + 3 * f) + 1.3 * static_cast<double>(step) +
                                                0.5 * static_cast<double>(micro))));
      }
      y.push_back((r + step + micro) % kClasses);
    }
    return std::pair{core::from_vector<float>(x, {end - begin, kIn}), core::from_vector<int64_t>(y, {end - begin})};
  };
  c.criterion = [](const Tensor& out, const Tensor& target) { return ops::cross_entropy(out, target); };
  return c;
}

namespace {

/// A two-block ViT on 8x8 one-channel images in 4x4 patches, 16 wide, MLP 32 wide, four classes.
std::shared_ptr<nn::Module> tiny_vit(core::Generator& init, int64_t heads) {
  nn::models::ViTConfig v;
  v.img_size = 8;
  v.patch_size = 4;
  v.in_chans = 1;
  v.num_classes = 4;
  v.embed_dim = 16;
  v.depth = 2;
  v.num_heads = heads;
  v.mlp_ratio = 2.0;
  return std::make_shared<nn::models::VisionTransformer>(v, &init);
}

}  // namespace

HarnessCase vit_case() {
  HarnessCase c;
  c.name = "vit";
  c.build_model = [](core::Generator& init) -> std::shared_ptr<nn::Module> { return tiny_vit(init, /*heads=*/2); };
  c.rows = [](int64_t step, int64_t micro, int64_t begin, int64_t end) {
    std::vector<float> x;
    std::vector<int64_t> y;
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t p = 0; p < 64; ++p) {
        x.push_back(static_cast<float>(std::cos(0.37 * static_cast<double>(p * (r + 1)) +
                                                0.9 * static_cast<double>(step) + 0.4 * static_cast<double>(micro))));
      }
      y.push_back((2 * r + step + micro) % 4);
    }
    return std::pair{core::from_vector<float>(x, {end - begin, 1, 8, 8}), core::from_vector<int64_t>(y, {end - begin})};
  };
  c.criterion = [](const Tensor& out, const Tensor& target) { return ops::cross_entropy(out, target); };
  return c;
}

HarnessCase vit_tp_case(bool sequence_parallel) {
  HarnessCase c = vit_case();
  if (sequence_parallel) c.name = "vit (sequence parallel)";
  c.build_model = [](core::Generator& init) -> std::shared_ptr<nn::Module> { return tiny_vit(init, /*heads=*/4); };
  c.parallelize = [sequence_parallel](nn::Module& serial,
                                      const parallel::ParallelContext& context) -> std::shared_ptr<nn::Module> {
    auto* vit = dynamic_cast<nn::models::VisionTransformer*>(&serial);
    if (vit == nullptr) throw Error("vit_tp_case: the serial model is not a VisionTransformer");
    return std::make_shared<parallel::tp::ParallelViT>(
        *vit, context.group(parallel::GroupKind::kTensor),
        parallel::tp::ParallelViTOptions{.sequence_parallel = sequence_parallel});
  };
  // The logits are whole on every rank: the serial criterion applies (parallel_criterion unset).
  return c;
}

HarnessCase vit_tp_specs_case(std::string name, std::vector<config::TensorSpecRule> rules) {
  HarnessCase c = vit_tp_case();
  c.name = "vit specs: " + name;
  c.parallelize = [rules = std::move(rules)](nn::Module& serial,
                                             const parallel::ParallelContext& context) -> std::shared_ptr<nn::Module> {
    auto* vit = dynamic_cast<nn::models::VisionTransformer*>(&serial);
    if (vit == nullptr) throw Error("vit_tp_specs_case: the serial model is not a VisionTransformer");
    std::vector<std::string> names;
    for (const auto& [n, p] : vit->named_parameters()) names.push_back(n);
    const std::shared_ptr<comm::ProcessGroup> group = context.group(parallel::GroupKind::kTensor);
    parallel::tp::ParallelViTOptions options;
    options.plan = parallel::tp::resolve_vit_specs(rules, vit->config(), names, group->size()).plan;
    return std::make_shared<parallel::tp::ParallelViT>(*vit, group, options);
  };
  return c;
}

namespace {

/// A two-block GPT-2 on a 32-token vocabulary and 16-token windows, 16 wide, dropout off.
std::shared_ptr<nn::Module> tiny_gpt2(core::Generator& init, int64_t heads) {
  nn::models::GPT2Config g;
  g.vocab_size = 32;
  g.n_positions = 16;
  g.n_embd = 16;
  g.n_layer = 2;
  g.n_head = heads;
  g.dropout = 0.0;
  return std::make_shared<nn::models::GPT2>(g, &init);
}

}  // namespace

HarnessCase gpt2_case() {
  HarnessCase c;
  c.name = "gpt2";
  static constexpr int64_t kVocab = 32, kT = 16;
  c.build_model = [](core::Generator& init) { return tiny_gpt2(init, /*heads=*/2); };
  c.rows = [](int64_t step, int64_t micro, int64_t begin, int64_t end) {
    std::vector<int64_t> x, y;
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t t = 0; t <= kT; ++t) {
        const int64_t token = (7 * r + 3 * t * t + 5 * step + 11 * micro) % kVocab;
        if (t < kT) x.push_back(token);
        if (t > 0) y.push_back(token);
      }
    }
    return std::pair{core::from_vector<int64_t>(x, {end - begin, kT}),
                     core::from_vector<int64_t>(y, {end - begin, kT})};
  };
  c.criterion = [](const Tensor& logits, const Tensor& target) { return nn::models::lm_cross_entropy(logits, target); };
  return c;
}

HarnessCase gpt2_tp_case(bool sequence_parallel, bool fused_residual, int64_t row_blocks) {
  HarnessCase c = gpt2_case();
  c.name = sequence_parallel ? "gpt2 (sequence parallel)" : fused_residual ? "gpt2 (residual in c_proj)" : "gpt2";
  if (row_blocks > 1) c.name += fmt::format(" in {} row blocks", row_blocks);
  c.build_model = [](core::Generator& init) { return tiny_gpt2(init, /*heads=*/4); };  // splits over 2 and 4

  c.parallelize = [sequence_parallel, fused_residual, row_blocks](
                      nn::Module& serial, const parallel::ParallelContext& context) -> std::shared_ptr<nn::Module> {
    auto* gpt2 = dynamic_cast<nn::models::GPT2*>(&serial);
    if (gpt2 == nullptr) throw Error("gpt2_tp_case: the serial model is not a GPT2");
    auto model = std::make_shared<parallel::tp::ParallelGPT2>(
        *gpt2, context.group(parallel::GroupKind::kTensor),
        parallel::tp::ParallelGPT2Options{.sequence_parallel = sequence_parallel, .fused_residual = fused_residual});
    if (row_blocks > 1) parallel::tp::set_row_blocks(*model, row_blocks);
    return model;
  };
  c.parallel_criterion = [](const parallel::ParallelContext& context) -> engine::Criterion {
    std::shared_ptr<comm::ProcessGroup> group = context.group(parallel::GroupKind::kTensor);
    return [group](const Tensor& logits, const Tensor& targets) {
      return parallel::tp::vocab_parallel_cross_entropy(logits, targets, *group);
    };
  };
  return c;
}

HarnessCase gpt2_tp_specs_case(std::string name, std::vector<config::TensorSpecRule> rules) {
  HarnessCase c = gpt2_case();
  c.name = "gpt2 specs: " + name;
  c.build_model = [](core::Generator& init) { return tiny_gpt2(init, /*heads=*/4); };  // splits over 2 and 4
  // The model parallelize makes, for its loss (vocab-parallel or serial as the specs split wte).
  auto made = std::make_shared<std::shared_ptr<parallel::tp::ParallelGPT2>>();
  c.parallelize = [rules = std::move(rules), made](
                      nn::Module& serial, const parallel::ParallelContext& context) -> std::shared_ptr<nn::Module> {
    auto* gpt2 = dynamic_cast<nn::models::GPT2*>(&serial);
    if (gpt2 == nullptr) throw Error("gpt2_tp_specs_case: the serial model is not a GPT2");
    std::vector<std::string> names;
    for (const auto& [n, p] : gpt2->named_parameters()) names.push_back(n);
    const std::shared_ptr<comm::ProcessGroup> group = context.group(parallel::GroupKind::kTensor);
    parallel::tp::ParallelGPT2Options options;
    options.plan = parallel::tp::resolve_gpt2_specs(rules, gpt2->config(), names, group->size()).plan;
    *made = std::make_shared<parallel::tp::ParallelGPT2>(*gpt2, group, options);
    return *made;
  };
  c.parallel_criterion = [made](const parallel::ParallelContext&) -> engine::Criterion {
    std::shared_ptr<parallel::tp::ParallelGPT2> model = *made;
    return [model](const Tensor& logits, const Tensor& targets) { return model->loss(logits, targets); };
  };
  return c;
}

}  // namespace colossal::testing
