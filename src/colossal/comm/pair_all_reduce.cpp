// use_pair_all_reduce: see pair_all_reduce.h.
#include "colossal/comm/pair_all_reduce.h"

#include <fmt/format.h>

#include "colossal/core/build_config.h"

#if COLOSSAL_WITH_NCCL
#include "colossal/comm/nccl/nccl_process_group.h"
#endif

namespace colossal::comm {

namespace {
/// False, saying in `why_not` that `group` is not NCCL on a GPU.
bool not_nccl(const ProcessGroup& group, std::string* why_not) {
  if (why_not != nullptr)
    *why_not = fmt::format("the group is {} on {}, not NCCL on a GPU", group.backend_name(), group.device());
  return false;
}
}  // namespace

bool use_pair_all_reduce(ProcessGroup& group, int64_t window_bytes, int64_t min_bytes, std::string* why_not) {
#if COLOSSAL_WITH_NCCL
  if (auto* nccl = dynamic_cast<NcclProcessGroup*>(&group))
    return nccl->use_pair_all_reduce(window_bytes, min_bytes, why_not);
#else
  (void)window_bytes;
  (void)min_bytes;
#endif
  return not_nccl(group, why_not);
}

bool use_pair_p2p(ProcessGroup& group, int64_t slot_bytes, int64_t slots, std::string* why_not) {
#if COLOSSAL_WITH_NCCL
  if (auto* nccl = dynamic_cast<NcclProcessGroup*>(&group)) return nccl->use_pair_p2p(slot_bytes, slots, why_not);
#else
  (void)slot_bytes;
  (void)slots;
#endif
  return not_nccl(group, why_not);
}

}  // namespace colossal::comm
