// ParallelContext: see parallel_context.h.
#include "colossal/parallel/parallel_context.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "colossal/comm/single_process_group.h"
#include "colossal/core/error.h"

namespace colossal::parallel {

ParallelContext ParallelContext::create(const config::ParallelConfig& config,
                                        std::shared_ptr<comm::ProcessGroup> world) {
  COLOSSAL_CHECK(world != nullptr, "ParallelContext needs the world group");
  ParallelContext context(ParallelLayout(config, world->size()), world);
  const int me = world->rank();
  for (const GroupKind kind : all_group_kinds()) {
    if (!context.layout_.has_group(kind)) continue;
    // The groups of a kind partition the world: one split makes all of them at once. Color: the
    // index of this rank's group in Colossal-AI's creation order; key: its place in that group.
    const std::vector<std::vector<int>> groups = context.layout_.all_groups(kind);
    int color = -1;
    for (size_t g = 0; g < groups.size() && color < 0; ++g) {
      if (std::find(groups[g].begin(), groups[g].end(), me) != groups[g].end()) color = static_cast<int>(g);
    }
    COLOSSAL_CHECK(color >= 0, "ParallelContext: rank {} is in no {} group of the layout", me, to_string(kind));
    std::shared_ptr<comm::ProcessGroup> group = world->split(color, context.layout_.rank_in_group(kind, me));
    COLOSSAL_CHECK(group != nullptr && group->global_ranks() == context.layout_.group(kind, me),
                   "ParallelContext: the {} group of rank {} came out as other ranks than the layout's",
                   to_string(kind), me);
    context.groups_.emplace(kind, std::move(group));
  }
  return context;
}

std::shared_ptr<const ParallelContext> ParallelContext::single_process(Device device) {
  return std::make_shared<const ParallelContext>(create(config::ParallelConfig{}, comm::single_process_group(device)));
}

const std::shared_ptr<comm::ProcessGroup>& ParallelContext::group(GroupKind kind) const {
  auto it = groups_.find(kind);
  COLOSSAL_CHECK(it != groups_.end(),
                 "ParallelContext: this layout has no {} group (the 2d, 2.5d and 3d groups exist only under their "
                 "parallel.tensor.mode; tensor size here {})",
                 to_string(kind), layout_.tensor_size());
  return it->second;
}

}  // namespace colossal::parallel
