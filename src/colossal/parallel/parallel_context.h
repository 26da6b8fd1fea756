// ParallelContext: the process groups of one run's dp x pp x tp layout (parallel/layout.h) over the
// world group, one group of every kind the layout has, as Colossal-AI's ParallelContext creates them,
// plus this rank's coordinates and per-mode seeds. Built collectively: every rank of the world calls
// create() with the same config. No globals: whoever needs groups is handed the context.
#pragma once

#include <cstdint>
#include <map>
#include <memory>

#include "colossal/comm/process_group.h"
#include "colossal/config/train_config.h"
#include "colossal/parallel/layout.h"

namespace colossal::parallel {

class ParallelContext {
 public:
  /// Validates `config` against the world's size (errors name the rule and the nearest valid sizes)
  /// and creates every group this rank belongs to: for each kind of all_group_kinds() the layout has,
  /// one split of the world (the groups of a kind partition it), ordered by the rank's place in its
  /// group, so group ranks are Colossal-AI's local ranks.
  static ParallelContext create(const config::ParallelConfig& config, std::shared_ptr<comm::ProcessGroup> world);
  /// The context of a run that is one process: dp = pp = tp = 1 over a single-process group
  /// (comm/single_process_group.h) whose tensors live on `device`.
  static std::shared_ptr<const ParallelContext> single_process(Device device);

  const ParallelLayout& layout() const { return layout_; }
  comm::ProcessGroup& world() const { return *world_; }
  int global_rank() const { return world_->rank(); }
  RankCoords coords() const { return layout_.coords(global_rank()); }
  bool has_group(GroupKind kind) const { return groups_.count(kind) > 0; }
  /// This rank's group of `kind`; throws naming the kind and the tensor mode when the layout has none.
  const std::shared_ptr<comm::ProcessGroup>& group(GroupKind kind) const;
  /// This rank's rank and the size of its `kind` group.
  int rank(GroupKind kind) const { return group(kind)->rank(); }
  int size(GroupKind kind) const { return group(kind)->size(); }
  /// The seed of `mode`'s random stream on this rank (ParallelLayout::seed_for).
  int64_t seed(SeedMode mode, int64_t base_seed) const { return layout_.seed_for(mode, base_seed, global_rank()); }

 private:
  ParallelContext(ParallelLayout layout, std::shared_ptr<comm::ProcessGroup> world)
      : layout_(std::move(layout)), world_(std::move(world)) {}

  ParallelLayout layout_;
  std::shared_ptr<comm::ProcessGroup> world_;
  std::map<GroupKind, std::shared_ptr<comm::ProcessGroup>> groups_;
};

}  // namespace colossal::parallel
