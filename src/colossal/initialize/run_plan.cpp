// plan_run: see run_plan.h.
#include "colossal/initialize/run_plan.h"

#include <algorithm>

#include "colossal/core/error.h"

namespace colossal::initialize {

RunPlan plan_run(int64_t rank_samples, int64_t batch_size, bool drop_last, int64_t accumulation, int64_t epochs,
                 int64_t max_steps) {
  COLOSSAL_CHECK(batch_size >= 1 && accumulation >= 1 && epochs >= 0 && max_steps >= 0,
                 "plan_run: batch_size {} and accumulation {} must be >= 1, epochs {} and max_steps {} >= 0",
                 batch_size, accumulation, epochs, max_steps);
  COLOSSAL_CHECK(epochs > 0 || max_steps > 0,
                 "train.epochs and train.max_steps are both 0: the run would never end; set train.epochs (passes over "
                 "the data) or train.max_steps (optimizer steps)");
  RunPlan plan;
  plan.batches_per_epoch = drop_last ? rank_samples / batch_size : (rank_samples + batch_size - 1) / batch_size;
  COLOSSAL_CHECK(plan.batches_per_epoch > 0,
                 "data.batch_size = {} exceeds the {} samples of the training set each data-parallel rank sees per "
                 "epoch (with data.drop_last = true no batch is left); lower data.batch_size to at most {}",
                 batch_size, rank_samples, rank_samples);
  plan.updates_per_epoch = plan.batches_per_epoch / accumulation;
  COLOSSAL_CHECK(plan.updates_per_epoch > 0,
                 "gradient_accumulation = {} needs that many batches for one optimizer step, but an epoch has {} "
                 "(data.batch_size = {} over {} samples per rank); lower gradient_accumulation to at most {}",
                 accumulation, plan.batches_per_epoch, batch_size, rank_samples, plan.batches_per_epoch);
  if (max_steps > 0) {
    // Enough epochs to make max_steps updates, and no more than asked for.
    const int64_t needed = (max_steps + plan.updates_per_epoch - 1) / plan.updates_per_epoch;
    plan.epochs = epochs > 0 ? std::min(epochs, needed) : needed;
    plan.total_updates = std::min(max_steps, plan.epochs * plan.updates_per_epoch);
    plan.max_updates = max_steps;
  } else {
    plan.epochs = epochs;
    plan.total_updates = epochs * plan.updates_per_epoch;
  }
  return plan;
}

}  // namespace colossal::initialize
