// Engine: see engine.h.
#include "colossal/engine/engine.h"

#include <utility>

#include "colossal/autograd/engine.h"     // backward
#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/error.h"          // COLOSSAL_CHECK
#include "colossal/core/tensor.h"         // from_vector
#include "colossal/ops/autocast.h"        // AutocastGuard
#include "colossal/ops/elementwise.h"     // div
#include "colossal/optim/clip_grad.h"     // clip_grad_norm

namespace colossal::engine {

Engine::Engine(std::shared_ptr<nn::Module> model, std::shared_ptr<optim::Optimizer> optimizer, Criterion criterion,
               EngineOptions options, std::shared_ptr<optim::LRScheduler> lr_scheduler)
    : model_(std::move(model)),
      optimizer_(std::move(optimizer)),
      criterion_(std::move(criterion)),
      options_(options),
      lr_scheduler_(std::move(lr_scheduler)) {
  COLOSSAL_CHECK(model_ != nullptr, "Engine needs a model");
  COLOSSAL_CHECK(optimizer_ != nullptr, "Engine needs an optimizer");
  COLOSSAL_CHECK(static_cast<bool>(criterion_), "Engine needs a criterion");
  COLOSSAL_CHECK(options_.gradient_accumulation >= 1, "gradient_accumulation must be >= 1, got {}",
                 options_.gradient_accumulation);
  COLOSSAL_CHECK(!options_.clip_grad_norm || *options_.clip_grad_norm > 0.0, "clip_grad_norm must be > 0, got {}",
                 options_.clip_grad_norm.value_or(0.0));
  if (options_.amp) amp_ = std::make_unique<amp::MixedPrecisionOptimizer>(model_, optimizer_, *options_.amp);
  if (options_.data_parallel_group) {
    // After the mixed-precision conversion: the gradient hooks sit on the tensors backward fills.
    data_parallel_ =
        std::make_unique<parallel::DataParallel>(*model_, options_.data_parallel_group, options_.data_parallel);
    if (amp_) {
      // The averaged gradients already carry any rank's inf; the flag's all-reduce makes the skip
      // decision explicit and keeps it right for state that is not averaged.
      amp_->set_found_inf_sync([group = options_.data_parallel_group](bool local) {
        Tensor flag = core::from_vector<int32_t>({local ? 1 : 0}, {1}).to(group->device());
        group->all_reduce(flag, comm::ReduceOp::max);
        return flag.to(Device{}).item<int32_t>() != 0;
      });
    }
  }
}

void Engine::zero_grad() {
  optimizer_->zero_grad();
  if (amp_) amp_->zero_grad();  // the model's 16-bit gradients; the optimizer holds the masters
  micro_step_ = 0;
}

Tensor Engine::step(const Tensor& input, const Tensor& target) {
  Tensor output = forward(input);
  Tensor loss = criterion_(output, target);
  // Dividing by the window length makes the summed gradient that of the window's mean loss.
  Tensor scaled =
      options_.gradient_accumulation == 1 ? loss : ops::div(loss, static_cast<double>(options_.gradient_accumulation));
  last_step_updated_ = micro_step_ + 1 == options_.gradient_accumulation;
  // Data parallel: gradients are averaged once per window, by the last micro-step's backward.
  if (data_parallel_) data_parallel_->set_sync(last_step_updated_);
  if (amp_) {
    amp_->backward(scaled);  // scaled by the loss scale in the fp16 modes
  } else {
    autograd::backward(scaled);
  }
  last_output_ = output.detach();
  ++micro_step_;
  if (last_step_updated_) {
    if (data_parallel_) data_parallel_->finish();
    if (amp_) {
      // Clipping sees the unscaled fp32 gradients; a skipped step still advances the schedule, as
      // torch's and Colossal-AI's loops do.
      const amp::AmpStepResult result = amp_->step(options_.clip_grad_norm, options_.clip_norm_type);
      last_step_skipped_ = !result.stepped;
      if (result.grad_norm.defined()) last_grad_norm_ = result.grad_norm;
    } else {
      if (options_.clip_grad_norm) {
        last_grad_norm_ =
            optim::clip_grad_norm_on_device(model_->parameters(), *options_.clip_grad_norm, options_.clip_norm_type);
      }
      optimizer_->step();
    }
    zero_grad();
    if (lr_scheduler_) lr_scheduler_->step();
    ++num_updates_;
  }
  Tensor reported = loss.detach();
  if (data_parallel_ && options_.report_mean_loss) {
    // The graph is gone, so the loss's own storage can take the mean.
    options_.data_parallel_group->all_reduce(reported, comm::ReduceOp::avg);
  }
  return reported;
}

Tensor Engine::forward(const Tensor& input) {
  if (!amp_) return model_->forward(input);
  // torch mode: an f32 model whose matrix products autocast to f16 (ops/autocast.h).
  std::optional<ops::AutocastGuard> autocast;
  if (options_.amp->mode == amp::AmpMode::torch) autocast.emplace(DType::f16);
  return amp_->cast_output(model_->forward(amp_->cast_input(input)));
}

std::optional<double> Engine::last_grad_norm() const {
  if (!last_grad_norm_.defined()) return std::nullopt;
  return last_grad_norm_.item<double>();
}

Tensor Engine::evaluate(const Tensor& input) {
  autograd::NoGradGuard no_grad;
  return forward(input);
}

}  // namespace colossal::engine
