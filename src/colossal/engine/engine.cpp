// Engine: see engine.h.
#include "colossal/engine/engine.h"

#include <map>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "colossal/autograd/engine.h"         // backward
#include "colossal/autograd/grad_mode.h"      // NoGradGuard
#include "colossal/core/error.h"              // COLOSSAL_CHECK
#include "colossal/core/profiler.h"           // Scope
#include "colossal/ops/autocast.h"            // AutocastGuard
#include "colossal/ops/elementwise.h"         // div
#include "colossal/optim/clip_grad.h"         // clip_grad_norm
#include "colossal/parallel/env_override.h"   // env_switch
#include "colossal/parallel/tp/shard_spec.h"  // collect_shard_specs
#include "colossal/parallel/zero/zero3.h"     // Zero3

namespace colossal::engine {

Engine::Engine(std::shared_ptr<nn::Module> model, std::shared_ptr<optim::Optimizer> optimizer, Criterion criterion,
               EngineOptions options, std::shared_ptr<optim::LRScheduler> lr_scheduler)
    : model_(std::move(model)),
      optimizer_(std::move(optimizer)),
      criterion_(std::move(criterion)),
      options_(std::move(options)),
      lr_scheduler_(std::move(lr_scheduler)) {
  COLOSSAL_CHECK(model_ != nullptr, "Engine needs a model");
  COLOSSAL_CHECK(optimizer_ != nullptr, "Engine needs an optimizer");
  COLOSSAL_CHECK(static_cast<bool>(criterion_), "Engine needs a criterion");
  COLOSSAL_CHECK(options_.gradient_accumulation >= 1, "gradient_accumulation must be >= 1, got {}",
                 options_.gradient_accumulation);
  COLOSSAL_CHECK(!options_.clip_grad_norm || *options_.clip_grad_norm > 0.0, "clip_grad_norm must be > 0, got {}",
                 options_.clip_grad_norm.value_or(0.0));
  if (const std::vector<Tensor> params = model_->parameters(); !params.empty()) device_ = params.front().device();
  context_ = options_.context;
  if (!context_) {
    // One process: the dp = pp = tp = 1 layout, its groups of one rank on the model's device.
    const std::vector<Tensor> params = model_->parameters();
    context_ = parallel::ParallelContext::single_process(params.empty() ? Device{} : params.front().device());
  }
  schedule_ = options_.schedule ? options_.schedule : std::make_shared<NonPipelineSchedule>();
  if (options_.amp) {
    amp::AmpOptions amp_options = *options_.amp;
    // ZeRO-3 with the optimizer offloaded takes the masters to the host anyway: made there, the
    // model's whole f32 copy does not stay on the GPU (Note [Masters on the host]).
    if (options_.zero && options_.zero->stage == 3 && options_.zero->offload_optimizer && device_.is_cuda()) {
      amp_options.masters_on_host = true;
    }
    amp_ = std::make_unique<amp::MixedPrecisionOptimizer>(model_, optimizer_, amp_options);
  }
  // After the mixed-precision conversion: the gradient hooks sit on the tensors backward fills.
  if (options_.zero) {
    COLOSSAL_CHECK(!options_.gradient_handler, "Engine: options.zero and options.gradient_handler are exclusive");
    // Every stage shards each tensor rank's own parameters over its data group (dp x tp).
    COLOSSAL_CHECK(context_->layout().pipeline_size() == 1,
                   "zero.stage = {} with parallel.pipeline = {}: ZeRO shards over the data-parallel group of a "
                   "layout without a pipeline; set parallel.pipeline = 1",
                   options_.zero->stage, context_->layout().pipeline_size());
    parallel::zero::ZeroOptions zero_options = *options_.zero;
    // Offload steps buckets (chunks) during backward only where no statistic of all gradients
    // (clipping's norm, fp16's overflow check) must come first (Note [Optimizer offload]).
    zero_options.step_during_backward =
        zero_options.offload_optimizer && !options_.clip_grad_norm && (amp_ == nullptr || amp_->scaler() == nullptr);
    const std::shared_ptr<comm::ProcessGroup> data = context_->group(parallel::GroupKind::kData);
    std::unique_ptr<parallel::zero::ZeroHandler> zero;
    if (zero_options.stage == 3) {
      zero = std::make_unique<parallel::zero::Zero3>(*model_, *optimizer_, amp_.get(), data, zero_options);
    } else {
      zero = std::make_unique<parallel::zero::LowLevelZero>(*model_, *optimizer_, amp_.get(), data, zero_options);
    }
    if (amp_ && zero->offloads_optimizer()) {
      amp_->set_optimizer_step([handler = zero.get()] { handler->step_on_host(); });
    }
    gradient_handler_ = std::move(zero);
  } else if (options_.gradient_handler) {
    gradient_handler_ = options_.gradient_handler(*model_, *context_);
  } else if (context_->layout().data_size() > 1) {
    gradient_handler_ = std::make_unique<parallel::DataParallel>(*model_, context_->group(parallel::GroupKind::kData),
                                                                 options_.data_parallel);
  }
  gradient_statistics_ = std::make_unique<parallel::GradientStatistics>(
      *context_, gradient_handler_ == nullptr || gradient_handler_->replicates_gradients());
  if (context_->layout().tensor_size() > 1) {
    // Parameters every tensor rank holds whole count once in the clipping norm (their masters under
    // mixed precision, index-aligned with the model's names).
    const std::map<std::string, parallel::tp::ShardSpec> specs = parallel::tp::collect_shard_specs(*model_);
    std::vector<Tensor> replicated;
    if (amp_) {
      const std::vector<std::string>& names = amp_->param_names();
      for (size_t k = 0; k < names.size(); ++k) {
        auto it = specs.find(names[k]);
        if (it != specs.end() && it->second.replicated()) replicated.push_back(amp_->master_params()[k]);
      }
    } else if (parallel::zero::ZeroHandler* z = zero()) {
      // The optimizer steps the shards, whose gradients the norm reads.
      for (size_t k = 0; k < z->param_names().size(); ++k) {
        if (specs.at(z->param_names()[k]).replicated()) replicated.push_back(z->shards()[k]);
      }
    } else {
      for (const auto& [name, p] : model_->named_parameters()) {
        if (specs.at(name).replicated()) replicated.push_back(p);
      }
    }
    gradient_statistics_->set_replicated_over_tensor(std::move(replicated));
  }
  // Note [Update under the next forward]
  const bool under_forward =
      parallel::env_switch("COLOSSAL_UPDATE_UNDER_FORWARD").value_or(options_.update_under_forward.value_or(false));
  if (under_forward && !gradient_handler_ && dynamic_cast<const NonPipelineSchedule*>(schedule_.get()) != nullptr) {
    const auto [stepped, model_params] = optimizer_tensors();
    update_under_forward_ = std::make_unique<UpdateUnderForward>(*model_, model_params, stepped);
  }
  if (amp_ && !gradient_statistics_->groups().empty()) {
    // Every rank that holds other gradients must skip the same steps and clip by the same norm.
    amp_->set_found_inf_sync([stats = gradient_statistics_.get()](bool local) { return stats->any_found_inf(local); });
    amp_->set_grad_norm([stats = gradient_statistics_.get()](const std::vector<Tensor>& params, double norm_type,
                                                             const Tensor& local_sum_of_squares) {
      return stats->grad_norm(params, norm_type, local_sum_of_squares);
    });
  }
}

void Engine::zero_grad() {
  if (gradient_handler_) gradient_handler_->zero_grad();
  optimizer_->zero_grad();
  if (amp_) amp_->zero_grad();  // the model's 16-bit gradients; the optimizer holds the masters
  micro_step_ = 0;
}

void Engine::backward(const Tensor& loss) {
  // Dividing by the window length makes the summed gradient that of the window's mean loss.
  const Tensor scaled =
      options_.gradient_accumulation == 1 ? loss : ops::div(loss, static_cast<double>(options_.gradient_accumulation));
  if (amp_) {
    amp_->backward(scaled);  // scaled by the loss scale in the fp16 modes
  } else {
    autograd::backward(scaled);
  }
}

Tensor Engine::step(const Tensor& input, const Tensor& target) {
  last_step_updated_ = micro_step_ + 1 == options_.gradient_accumulation;
  // Gradients are reduced once per window, by the last micro-step's backward.
  if (gradient_handler_) gradient_handler_->set_sync(last_step_updated_);
  Tensor reported = schedule_->forward_backward(*this, input, target);
  ++micro_step_;
  // The graph is gone, so the loss's own storage can take the mean.
  const bool mean = options_.report_mean_loss && context_->layout().data_size() > 1;
  std::optional<comm::Work> report;
  if (mean && gradient_handler_ && gradient_handler_->issue_all()) {
    // Note [The reported loss beside the update]
    core::profiler::Scope scope("loss all_reduce (report)", device_);
    report = context_->group(parallel::GroupKind::kData)->all_reduce(reported, comm::ReduceOp::avg, /*async=*/true);
  }
  if (last_step_updated_) update();
  if (report) {
    report->wait();
  } else if (mean) {
    core::profiler::Scope scope("loss all_reduce (report)", device_);
    context_->group(parallel::GroupKind::kData)->all_reduce(reported, comm::ReduceOp::avg);
  }
  return reported;
}

// Note [The reported loss beside the update]
// step() returns the data group's mean loss: one all-reduce of a scalar. Issued after the update, it
// sat on the step's critical path on GPUs: the communicator's stream took it up only once the update's
// kernels were queued behind it, and the next step's first kernel waited for it, about 0.1 ms a step on
// 2 H100s (session 16's traces). So where the gradient handler can say that every collective of the
// window's reduction is already issued (GradientHandler::issue_all: DataParallel launches the buckets
// backward left), the all-reduce is issued before the update: it runs on the communicator's stream
// right behind the last buckets, while the update runs, and the wait after the update (a stream wait
// on GPUs) finds it done. Every rank issues it at the same point of its collectives on the data
// group. ZeRO stages 1 and 2 can say so too (their finish() issues nothing more; the all-gathers come
// after the update on every rank alike). Where the handler cannot (ZeRO-3), it is issued after the
// update as before.

// Note [Update beside the last reductions]
// The data-parallel all-reduce of the last buckets (GPT-2's: h.0 with wpe, and the tied wte, 77 MB,
// whose gradient is complete only after the embedding's backward, the step's last kernel) cannot
// overlap backward: the update waited for it with the GPU idle, ~0.3 ms of a 33 ms step on 2 H100s.
// Adam's, SGD's and the other optimizers' updates are per element, so the parameters of every other
// bucket can be stepped first while those reductions run on the communicator's stream, and the late
// ones after: the same numbers, bit for bit, in two launches. The handler waits for all but the
// last buckets (GradientHandler::finish_all_but_late; DataParallelOptions::late_buckets), and the
// optimizer steps in two parts (Optimizer::step_next_in_parts: the early parameters, then, once
// finish() has waited for the late ones, those). Only where nothing needs every gradient
// before the step: no clipping (the global norm), no fp16 loss scale (the overflow check that may
// skip it), no before_update hook, and under mixed precision only where its step is fused (the
// three-pass step would copy every master into the model twice). ZeRO stages 1 and 2 on the device
// do the same with the shards the optimizer steps: the late buckets' shards are set aside while the
// others step, their reduce-scatters still running (LowLevelZero::finish_all_but_late).
// Note [Update under the next forward]
// The optimizer's update is a pass over every parameter and its state, 28 bytes per parameter for
// AdamW under bf16: 7 ms of an 86 ms step of GPT 1.3B at tp=2 on an H100, with nothing else on the
// GPU. Meanwhile the next forward leaves the GPU's SMs idle for about as long: its tensor-parallel
// all-reduces (7 ms of exposed communication at tp=2) and its launch gaps. Nothing in the next forward
// needs all of the update, only each block's own parameters, and those only when the block starts.
// So, when asked, the update runs on a stream of its own (UpdateUnderForward): that stream waits for
// the step's backward, then takes clipping's norm, the overflow check and the optimizer's step as
// before, but the step goes part by part (Optimizer::step_next_in_parts), one part per unit of the
// model (parallel/zero/units.h: each block, and the model's own parameters, the embeddings and the
// tied head, first), with an event after each. The host goes on to the next step at once; each unit's
// forward pre-hook makes the compute stream wait for its part's event, and the end of the model's
// forward waits for everything (backward reads every parameter). The numbers are those of one update,
// bit for bit (every part is stepped with the same norm, scales and step counts; the tests compare the
// runs on the CPU and a GPU). The gradients the update reads were made on the compute stream, whose
// allocator would hand their memory out again as soon as zero_grad drops them, so they are held until
// the compute stream has waited for their part. The host never waits: a read of the last norm
// (last_grad_norm) synchronises with the update, and whatever reads the parameters or the optimizer's
// state outside the forward goes through Engine::model() or Engine::wait_for_update() (checkpoints
// do). Only where no gradient handler runs (DataParallel's and ZeRO's own schedules of their
// reductions and gathers are left as they are), without a pipeline schedule (whose stages' forwards
// the Engine does not run), and once the first forward has shown that every unit's pre-hook runs (a
// model that calls its blocks through forward() updates at the step's end).
// Measured (GPT 1.3B at tp=2 on 2 H100s, session 19): 85.7 against 86.0 ms a step, and 86.1 against
// 86.6 with the compute stream's priority above the update stream's: no gain. The parts run beside the
// forward's GEMMs and take about as much from them as they save (the forward's device time grew from
// 30 to 36-38 ms). Running each part only where the forward idles (its waits for the all-reduces)
// needs the update stream to wait for a gate the forward opens, and a gate left shut blocks every
// device-wide synchronisation. Two tries were built and taken out. The first (session 19) hung at the
// end of training. The second (session 20: each unit in two pieces, one word of device memory per
// piece, opened at the forward's waits for its collectives or in the unit's pre-hook, and opened from
// an idle stream before every device-wide wait colossal makes and every driver call it makes that
// waits for the device) was 0.5-0.7 ms a step faster (85.21-86.33 against 85.76-87.04 ms in two calls),
// and it still hung: an evaluation forward between two steps stopped inside its first block, where
// something below colossal (a library's lazy set-up) waited for the whole device while the later
// pieces' gates were shut. A gate the program cannot see every waiter of is not safe, so the update
// runs ungated, off by default: EngineOptions::update_under_forward, COLOSSAL_UPDATE_UNDER_FORWARD=1.

std::vector<Tensor> Engine::stepped_tensors() {
  if (const parallel::zero::ZeroHandler* z = zero()) return z->shards();
  return model_->parameters();
}

bool Engine::updates_in_two_parts() const {
  if (!gradient_handler_ || options_.clip_grad_norm || options_.before_update) return false;
  // ZeRO steps its shards (the handler's finish_all_but_late says whether it can give them in two
  // parts); not on the host.
  if (const auto* z = dynamic_cast<const parallel::zero::ZeroHandler*>(gradient_handler_.get());
      z != nullptr && z->offloads_optimizer()) {
    return false;
  }
  if (amp_) return amp_->scaler() == nullptr && amp_->fuses_step(std::nullopt, options_.clip_norm_type);
  return true;
}

void Engine::step_parameters_with_gradients() {
  if (amp_) {
    last_step_skipped_ = !amp_->step(std::nullopt, options_.clip_norm_type).stepped;
  } else {
    core::profiler::Scope scope("update: optimizer step", device_);
    optimizer_->step();
  }
}

void Engine::step_in_two_parts(const std::vector<Tensor>& late) {
  // Note [Update beside the last reductions]: the early part, then the handler's last reductions, then
  // the late part, in one step of the optimizer (Optimizer::step_next_in_parts).
  std::unordered_set<const core::TensorImpl*> is_late;
  for (const Tensor& t : late) is_late.insert(t.impl());
  const auto [stepped, known_as] = optimizer_tensors();
  std::vector<std::vector<Tensor>> parts(2);
  for (size_t k = 0; k < stepped.size(); ++k) parts[is_late.contains(known_as[k].impl()) ? 1 : 0].push_back(stepped[k]);
  optimizer_->step_next_in_parts(std::move(parts), [this](size_t part) {
    if (part != 0) return;
    core::profiler::Scope scope("update: gradient handler finish", device_);
    gradient_handler_->finish();
  });
  step_parameters_with_gradients();
}

std::pair<std::vector<Tensor>, std::vector<Tensor>> Engine::optimizer_tensors() const {
  const bool sharded = dynamic_cast<const parallel::zero::ZeroHandler*>(gradient_handler_.get()) != nullptr;
  if (amp_ && !sharded) return {amp_->master_params(), amp_->model_params()};
  std::vector<Tensor> stepped;
  for (const optim::ParamGroup& group : optimizer_->param_groups()) {
    stepped.insert(stepped.end(), group.params.begin(), group.params.end());
  }
  return {stepped, stepped};
}

void Engine::update() {
  core::profiler::Scope update_scope("update", device_);
  std::vector<Tensor> late;  // parameters whose reduction is still running (two-part update)
  if (gradient_handler_) {
    core::profiler::Scope scope("update: gradient handler finish", device_);
    if (updates_in_two_parts()) {
      late = gradient_handler_->finish_all_but_late();
    } else {
      gradient_handler_->finish();
    }
  }
  if (!late.empty()) {
    step_in_two_parts(late);
  } else if (update_under_forward_ && update_under_forward_->units_hooked()) {
    update_under_forward_->run(*optimizer_, [this] { step_whole(); });
  } else {
    step_whole();
  }
  if (gradient_handler_) gradient_handler_->after_update(!last_step_skipped_);
  zero_grad();
  if (lr_scheduler_) lr_scheduler_->step();
  ++num_updates_;
}

void Engine::step_whole() {
  if (options_.before_update) options_.before_update(*this);
  if (amp_) {
    // Clipping sees the unscaled fp32 gradients; a skipped step still advances the schedule, as
    // torch's and Colossal-AI's loops do.
    const amp::AmpStepResult result = amp_->step(options_.clip_grad_norm, options_.clip_norm_type);
    last_step_skipped_ = !result.stepped;
    if (result.grad_norm.defined()) last_grad_norm_ = result.grad_norm;
  } else {
    if (options_.clip_grad_norm) {
      core::profiler::Scope scope("update: gradient norm", device_);
      // The factor stays on the device and scales the gradients inside the optimizer's update
      // (Note [Clipping in one pass] in optim/clip_grad.cpp), those of the tensors the optimizer steps.
      last_grad_norm_ = gradient_statistics_->grad_norm(stepped_tensors(), options_.clip_norm_type);
      optimizer_->scale_gradients_in_next_step(optim::clip_coefficient(last_grad_norm_, *options_.clip_grad_norm));
    }
    core::profiler::Scope scope("update: optimizer step", device_);
    if (parallel::zero::ZeroHandler* z = zero(); z != nullptr && z->offloads_optimizer()) {
      z->step_on_host();  // ZeRO's optimizer offload (Note [Optimizer offload])
    } else {
      optimizer_->step();
    }
  }
}

Tensor NonPipelineSchedule::forward_backward(Engine& engine, const Tensor& input, const Tensor& target) {
  Tensor output, loss;
  {
    core::profiler::Scope scope("forward", engine.device());
    output = engine.forward(input);
  }
  {
    core::profiler::Scope scope("loss", engine.device());
    loss = engine.criterion(output, target);
  }
  {
    core::profiler::Scope scope("backward", engine.device());
    engine.backward(loss);
  }
  engine.set_last_output(output.detach());
  return loss.detach();
}

Tensor Engine::forward(const Tensor& input) {
  // Through operator(): the model's forward hooks run (ZeRO-3's, Note [Forward hooks] in nn/module.cpp).
  if (!amp_) return (*model_)(input);
  // torch mode: an f32 model whose matrix products autocast to f16 (ops/autocast.h).
  std::optional<ops::AutocastGuard> autocast;
  if (options_.amp->mode == amp::AmpMode::torch) autocast.emplace(DType::f16);
  return amp_->cast_output((*model_)(amp_->cast_input(input)));
}

void Engine::wait_for_update() {
  if (gradient_handler_) gradient_handler_->wait_for_parameters();
  if (update_under_forward_) update_under_forward_->wait();
}

std::optional<double> Engine::last_grad_norm() const {
  if (!last_grad_norm_.defined()) return std::nullopt;
  if (update_under_forward_) update_under_forward_->synchronize();  // the norm is the update's
  return last_grad_norm_.item<double>();
}

Tensor Engine::evaluate(const Tensor& input) {
  autograd::NoGradGuard no_grad;
  if (Tensor output = schedule_->evaluate(*this, input); output.defined()) return output;  // a pipeline's
  return forward(input);
}

}  // namespace colossal::engine
