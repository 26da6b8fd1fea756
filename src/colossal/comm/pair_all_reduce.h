// use_pair_all_reduce and use_pair_p2p: turn on the copy-engine all-reduce of a two-GPU NCCL group
// (comm/nccl/pair_all_reduce.h, Note [Pair all-reduce by the copy engines]) and its copy-engine sends
// and receives (comm/nccl/pair_p2p.h, Note [Pair sends and receives by the copy engines]) from code
// that sees only a ProcessGroup, in every build.
#pragma once

#include <cstdint>
#include <string>

#include "colossal/comm/process_group.h"

namespace colossal::comm {

/// From now on, sums of f32, bf16 and f16 tensors of at least `min_bytes` over `group` are moved by
/// the copy engines through a window of `window_bytes` on each GPU. Collective over `group`. Returns
/// false, saying why in `why_not`, where `group` is not NCCL over two GPUs of one host that can map
/// each other's memory (or the build has no NCCL).
bool use_pair_all_reduce(ProcessGroup& group, int64_t window_bytes, int64_t min_bytes, std::string* why_not = nullptr);

/// From now on, batch_send_recv over `group` (and send, recv) is moved by the copy engines through
/// `slots` slots of `slot_bytes` on each GPU. Collective over `group`. Returns false, saying why in
/// `why_not`, where `group` is not NCCL over two GPUs of one host that can map each other's memory.
bool use_pair_p2p(ProcessGroup& group, int64_t slot_bytes, int64_t slots, std::string* why_not = nullptr);

}  // namespace colossal::comm
