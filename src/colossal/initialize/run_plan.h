// RunPlan: how long a training run is, from the data and the config, in the units each part counts
// in: batches per epoch (the loader), optimizer updates (the LR schedule, train.max_steps, the
// checkpoint's count) and epochs (the Trainer's loop). Pure arithmetic, shared by every rank.
#pragma once

#include <cstdint>

namespace colossal::initialize {

struct RunPlan {
  int64_t batches_per_epoch = 0;  ///< iterations of one epoch on each data-parallel rank (what its loader yields)
  int64_t updates_per_epoch = 0;  ///< optimizer updates an epoch makes: whole accumulation windows
  int64_t epochs = 0;             ///< epochs the loop enters; the last may be cut short at max_updates
  int64_t max_updates = 0;        ///< the run stops after this many updates (train.max_steps); 0: after `epochs`
  int64_t total_updates = 0;      ///< updates the run makes in all: the LR schedule's length
};

/// `rank_samples`: the samples one data-parallel rank sees per epoch (its sampler's size);
/// `batch_size`: per rank per iteration; `accumulation`: iterations per update. `epochs` and
/// `max_steps` as train.epochs and train.max_steps (0: unbounded; not both). An accumulation
/// window never spans two epochs (the Trainer drops an unfinished one at an epoch's start), so an
/// epoch makes floor(batches / accumulation) updates. Throws colossal::Error naming the keys when an
/// epoch makes no batch or no update.
RunPlan plan_run(int64_t rank_samples, int64_t batch_size, bool drop_last, int64_t accumulation, int64_t epochs,
                 int64_t max_steps);

}  // namespace colossal::initialize
