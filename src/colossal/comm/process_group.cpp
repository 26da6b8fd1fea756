// ProcessGroup's backend-independent half: argument checks with messages that name the op, the
// tensors and the group, the synchronous wrappers, and split()/new_group() bookkeeping (who is in the
// new group, at which rank, with which world ranks).
#include "colossal/comm/process_group.h"

#include "colossal/comm/timeout.h"  // kDefaultCollectiveTimeout

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>

namespace colossal::comm {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "?";
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0 || a.device() != b.device()) return false;
  const auto* a_begin = static_cast<const char*>(a.raw_data());
  const auto* b_begin = static_cast<const char*>(b.raw_data());
  return a_begin < b_begin + b.nbytes() && b_begin < a_begin + a.nbytes();
}

ProcessGroup::ProcessGroup(int rank, int size) : rank_(rank), size_(size), timeout_(kDefaultCollectiveTimeout) {
  COLOSSAL_CHECK(size >= 1 && rank >= 0 && rank < size, "ProcessGroup: rank {} is outside a group of {} ranks", rank,
                 size);
  global_ranks_.resize(static_cast<size_t>(size));
  std::iota(global_ranks_.begin(), global_ranks_.end(), 0);
}

void ProcessGroup::set_global_ranks(std::vector<int> global_ranks) {
  COLOSSAL_CHECK(static_cast<int>(global_ranks.size()) == size_, "ProcessGroup: {} world ranks given for a group of {}",
                 global_ranks.size(), size_);
  global_ranks_ = std::move(global_ranks);
  description_.reset();
}

void ProcessGroup::set_timeout(std::chrono::milliseconds timeout) {
  COLOSSAL_CHECK(timeout.count() > 0, "set_timeout: the collective timeout must be positive, got {} ms [{}]",
                 timeout.count(), describe());
  timeout_ = timeout;
}

const std::shared_ptr<const std::string>& ProcessGroup::shared_description() const {
  if (!description_) description_ = std::make_shared<const std::string>(describe());
  return description_;
}

std::string ProcessGroup::describe() const {
  constexpr size_t kMaxListed = 16;
  std::vector<int> listed(global_ranks_.begin(),
                          global_ranks_.begin() + static_cast<long>(std::min(kMaxListed, global_ranks_.size())));
  return fmt::format("{} group of {} rank{} (world ranks {}{}), this is rank {}", backend_name(), size_,
                     size_ == 1 ? "" : "s", fmt::join(listed, ", "), global_ranks_.size() > kMaxListed ? ", ..." : "",
                     rank_);
}

std::string describe_p2p(const std::vector<P2POp>& ops) {
  constexpr size_t kMaxListed = 4;
  if (ops.empty()) return "batch_send_recv of no ops";
  std::vector<std::string> parts;
  for (size_t i = 0; i < ops.size() && i < kMaxListed; ++i) {
    const P2POp& p2p = ops[i];
    const bool is_send = p2p.kind == P2POp::Kind::send;
    parts.push_back(fmt::format("{} of a {} tensor of shape {} {} rank {} (tag {})", is_send ? "send" : "recv",
                                p2p.tensor.dtype(), p2p.tensor.shape(), is_send ? "to" : "from", p2p.peer, p2p.tag));
  }
  if (ops.size() == 1) return parts[0];
  return fmt::format("batch_send_recv of {} ops ({}{})", ops.size(), fmt::join(parts, "; "),
                     ops.size() > kMaxListed ? "; ..." : "");
}

// ---- argument checks

void ProcessGroup::check_tensor(std::string_view op, const Tensor& tensor, std::string_view name) const {
  COLOSSAL_CHECK(tensor.defined(), "{}: {} is undefined [{}]", op, name, describe());
  COLOSSAL_CHECK(tensor.is_contiguous(),
                 "{}: {} (shape {}, strides {}) is not contiguous; communication works in place on "
                 "contiguous memory: pass t.contiguous() and copy the result back [{}]",
                 op, name, tensor.shape(), tensor.strides(), describe());
  COLOSSAL_CHECK(tensor.device() == device(), "{}: {} (shape {}) is on {}, but this {} group works on {}{} [{}]", op,
                 name, tensor.shape(), tensor.device(), backend_name(), device(),
                 device().is_cpu() ? " (GPU tensors need the nccl backend)" : "", describe());
}

void ProcessGroup::check_reduction(std::string_view op, const Tensor& tensor, ReduceOp reduce_op) const {
  COLOSSAL_CHECK(tensor.dtype() != DType::boolean || reduce_op == ReduceOp::max || reduce_op == ReduceOp::min,
                 "{}: ReduceOp::{} on a bool tensor (shape {}); bool takes max (logical or) or min (logical and) "
                 "[{}]",
                 op, reduce_op_name(reduce_op), tensor.shape(), describe());
}

void ProcessGroup::check_peer(std::string_view op, int peer, std::string_view role) const {
  COLOSSAL_CHECK(peer >= 0 && peer < size_, "{}: {} rank {} is outside the group (ranks 0 to {}) [{}]", op, role, peer,
                 size_ - 1, describe());
}

namespace {
/// The shape a gathered/scattered tensor has: `chunk`'s with dim 0 times `size` (a 0-dim chunk
/// gathers into a vector of `size`).
Shape stacked_shape(const Shape& chunk, int size) {
  if (chunk.empty()) return {size};
  Shape out = chunk;
  out[0] *= size;
  return out;
}
}  // namespace

// ---- collectives

Work ProcessGroup::all_reduce(const Tensor& tensor, ReduceOp op, bool async) {
  check_tensor("all_reduce", tensor, "tensor");
  check_reduction("all_reduce", tensor, op);
  Work work = do_all_reduce(tensor, op);
  if (!async) work.wait();
  return work;
}

namespace {

/// The packed collectives' parts: each fits at its offset in the 1-D `flat` before the next one, with
/// flat's dtype and device, contiguous (undefined parts are zeros).
void check_packed_parts(std::string_view what, const Tensor& flat, const std::vector<Tensor>& parts,
                        const std::vector<int64_t>& offsets, const std::string& group) {
  COLOSSAL_CHECK(flat.dim() == 1, "{}: flat must be 1-D, got shape {} [{}]", what, flat.shape(), group);
  COLOSSAL_CHECK(parts.size() == offsets.size(), "{}: {} parts but {} offsets [{}]", what, parts.size(), offsets.size(),
                 group);
  for (size_t i = 0; i < parts.size(); ++i) {
    const int64_t end = i + 1 < offsets.size() ? offsets[i + 1] : flat.numel();
    COLOSSAL_CHECK(offsets[i] >= 0 && offsets[i] <= end && end <= flat.numel(),
                   "{}: part {} at offset {} does not fit before {} in a flat of {} elements [{}]", what, i, offsets[i],
                   end, flat.numel(), group);
    if (!parts[i].defined()) continue;
    COLOSSAL_CHECK(parts[i].dtype() == flat.dtype() && parts[i].device() == flat.device() && parts[i].is_contiguous(),
                   "{}: part {} is a {} {} tensor on {}; parts must be contiguous {} tensors on {} [{}]", what, i,
                   parts[i].is_contiguous() ? "contiguous" : "strided", parts[i].dtype(), parts[i].device(),
                   flat.dtype(), flat.device(), group);
    COLOSSAL_CHECK(offsets[i] + parts[i].numel() <= end,
                   "{}: part {} ({} elements at offset {}) overlaps what follows at {} [{}]", what, i, parts[i].numel(),
                   offsets[i], end, group);
  }
}

}  // namespace

Work ProcessGroup::all_reduce_packed(const Tensor& flat, const std::vector<Tensor>& parts,
                                     const std::vector<int64_t>& offsets, ReduceOp op, bool async) {
  check_tensor("all_reduce_packed", flat, "flat");
  check_reduction("all_reduce_packed", flat, op);
  check_packed_parts("all_reduce_packed", flat, parts, offsets, describe());
  Work work = do_all_reduce_packed(flat, parts, offsets, op);
  if (!async) work.wait();
  return work;
}

Work ProcessGroup::reduce_scatter_packed(const Tensor& output, const Tensor& flat, const std::vector<Tensor>& parts,
                                         const std::vector<int64_t>& offsets, ReduceOp op, bool async) {
  check_tensor("reduce_scatter_packed", output, "output");
  check_tensor("reduce_scatter_packed", flat, "flat");
  check_reduction("reduce_scatter_packed", flat, op);
  check_packed_parts("reduce_scatter_packed", flat, parts, offsets, describe());
  COLOSSAL_CHECK(output.dtype() == flat.dtype() && output.dim() == 1 && output.numel() * size_ == flat.numel(),
                 "reduce_scatter_packed: output is a {} tensor of shape {} but needs to be 1-D {} with {} elements: "
                 "flat's {} over the group size {} [{}]",
                 output.dtype(), output.shape(), flat.dtype(), flat.numel() / size_, flat.numel(), size_, describe());
  COLOSSAL_CHECK(!overlaps(output, flat), "reduce_scatter_packed: output overlaps flat; give it memory of its own [{}]",
                 describe());
  Work work = do_reduce_scatter_packed(output, flat, parts, offsets, op);
  if (!async) work.wait();
  return work;
}

/// Copies parts into flat (all_reduce_packed's packing) on the current stream.
void pack_parts(const Tensor& flat, const std::vector<Tensor>& parts, const std::vector<int64_t>& offsets) {
  for (size_t i = 0; i < parts.size(); ++i) {
    const int64_t end = i + 1 < offsets.size() ? offsets[i + 1] : flat.numel();
    if (parts[i].defined()) {
      const Tensor slice = flat.narrow(0, offsets[i], parts[i].numel());
      if (slice.raw_data() != parts[i].raw_data()) slice.copy_(parts[i].reshape({parts[i].numel()}));  // else: in place
    } else {
      flat.narrow(0, offsets[i], end - offsets[i]).zero_();
    }
  }
}

Work ProcessGroup::do_all_reduce_packed(const Tensor& flat, const std::vector<Tensor>& parts,
                                        const std::vector<int64_t>& offsets, ReduceOp op) {
  pack_parts(flat, parts, offsets);
  return do_all_reduce(flat, op);
}

Work ProcessGroup::do_reduce_scatter_packed(const Tensor& output, const Tensor& flat, const std::vector<Tensor>& parts,
                                            const std::vector<int64_t>& offsets, ReduceOp op) {
  pack_parts(flat, parts, offsets);
  return do_reduce_scatter(output, flat, op);
}

Work ProcessGroup::reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op, bool async) {
  check_tensor("reduce_scatter", output, "output");
  check_tensor("reduce_scatter", input, "input");
  check_reduction("reduce_scatter", input, op);
  COLOSSAL_CHECK(output.dtype() == input.dtype(), "reduce_scatter: output is {} but input is {} [{}]", output.dtype(),
                 input.dtype(), describe());
  const Shape expected = stacked_shape(output.shape(), size_);
  COLOSSAL_CHECK(input.shape() == expected,
                 "reduce_scatter: input has shape {} but needs {}: output's shape {} with dim 0 times the group size "
                 "{} [{}]",
                 input.shape(), expected, output.shape(), size_, describe());
  Work work = do_reduce_scatter(output, input, op);
  if (!async) work.wait();
  return work;
}

Work ProcessGroup::all_gather(const Tensor& output, const Tensor& input, bool async) {
  check_tensor("all_gather", output, "output");
  check_tensor("all_gather", input, "input");
  COLOSSAL_CHECK(output.dtype() == input.dtype(), "all_gather: output is {} but input is {} [{}]", output.dtype(),
                 input.dtype(), describe());
  const Shape expected = stacked_shape(input.shape(), size_);
  COLOSSAL_CHECK(output.shape() == expected,
                 "all_gather: output has shape {} but needs {}: input's shape {} with dim 0 times the group size {} "
                 "[{}]",
                 output.shape(), expected, input.shape(), size_, describe());
  Work work = do_all_gather(output, input);
  if (!async) work.wait();
  return work;
}

Work ProcessGroup::broadcast(const Tensor& tensor, int root, bool async) {
  check_tensor("broadcast", tensor, "tensor");
  check_peer("broadcast", root, "root");
  Work work = do_broadcast(tensor, root);
  if (!async) work.wait();
  return work;
}

Work ProcessGroup::reduce(const Tensor& tensor, int root, ReduceOp op, bool async) {
  check_tensor("reduce", tensor, "tensor");
  check_reduction("reduce", tensor, op);
  check_peer("reduce", root, "root");
  Work work = do_reduce(tensor, root, op);
  if (!async) work.wait();
  return work;
}

Work ProcessGroup::send(const Tensor& tensor, int dst, int tag, bool async) {
  return batch_send_recv({P2POp{P2POp::Kind::send, tensor, dst, tag}}, async);
}

Work ProcessGroup::recv(const Tensor& tensor, int src, int tag, bool async) {
  return batch_send_recv({P2POp{P2POp::Kind::recv, tensor, src, tag}}, async);
}

Work ProcessGroup::batch_send_recv(const std::vector<P2POp>& ops, bool async) {
  for (const P2POp& p2p : ops) {
    const bool is_send = p2p.kind == P2POp::Kind::send;
    const std::string_view op = is_send ? "send" : "recv";
    check_tensor(op, p2p.tensor, "tensor");
    check_peer(op, p2p.peer, is_send ? "destination" : "source");
    COLOSSAL_CHECK(p2p.peer != rank_, "{}: rank {} cannot {} itself; copy the tensor instead [{}]", op, rank_,
                   is_send ? "send to" : "receive from", describe());
    COLOSSAL_CHECK(p2p.tag >= 0, "{}: tag {} is negative; tags are >= 0 [{}]", op, p2p.tag, describe());
  }
  if (ops.empty()) return Work();
  Work work = do_batch_send_recv(ops);
  if (!async) work.wait();
  return work;
}

Work ProcessGroup::all_to_all(const Tensor& output, const Tensor& input, bool async) {
  check_tensor("all_to_all", output, "output");
  check_tensor("all_to_all", input, "input");
  COLOSSAL_CHECK(output.dtype() == input.dtype(), "all_to_all: output is {} but input is {} [{}]", output.dtype(),
                 input.dtype(), describe());
  COLOSSAL_CHECK(output.shape() == input.shape(), "all_to_all: output has shape {} but input {}; they must match [{}]",
                 output.shape(), input.shape(), describe());
  COLOSSAL_CHECK(input.dim() >= 1 && input.size(0) % size_ == 0,
                 "all_to_all: input's shape {} does not split into {} equal chunks along dim 0 [{}]", input.shape(),
                 size_, describe());
  Work work = do_all_to_all(output, input);
  if (!async) work.wait();
  return work;
}

Work ProcessGroup::barrier(bool async) {
  Work work = do_barrier();
  if (!async) work.wait();
  return work;
}

// ---- sub-groups

namespace {
/// Identifies a rank list, so new_group can tell whether every caller passed the same one.
int64_t hash_ranks(const std::vector<int>& ranks) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  auto mix = [&h](uint64_t v) {
    h ^= v;
    h *= 1099511628211ull;
  };
  mix(ranks.size());
  for (int r : ranks) mix(static_cast<uint64_t>(static_cast<uint32_t>(r)));
  return static_cast<int64_t>(h & 0x7fffffffffffffffull);
}

struct SplitEntry {
  int64_t color, key, global_rank, list_hash;
};
}  // namespace

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key) {
  // Every rank learns every rank's (color, key) first: that gives the members of its new group, their
  // order and world ranks, and lets new_group() compare the lists all callers passed.
  return split_checked(color, key, 0);
}

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(const std::vector<int>& ranks) {
  COLOSSAL_CHECK(!ranks.empty(), "new_group: the rank list is empty [{}]", describe());
  std::set<int> seen;
  for (int r : ranks) {
    COLOSSAL_CHECK(r >= 0 && r < size_, "new_group: rank {} in [{}] is outside this group (ranks 0 to {}) [{}]", r,
                   fmt::join(ranks, ", "), size_ - 1, describe());
    COLOSSAL_CHECK(seen.insert(r).second, "new_group: rank {} appears twice in [{}] [{}]", r, fmt::join(ranks, ", "),
                   describe());
  }
  const auto position = std::find(ranks.begin(), ranks.end(), rank_);
  const bool member = position != ranks.end();
  return split_checked(member ? 0 : kNoColor, member ? static_cast<int>(position - ranks.begin()) : 0,
                       hash_ranks(ranks));
}

std::shared_ptr<ProcessGroup> ProcessGroup::split_checked(int color, int key, int64_t list_hash) {
  const int64_t my_color = color < 0 ? kNoColor : color;
  Tensor mine = from_vector<int64_t>({my_color, key, global_ranks_[static_cast<size_t>(rank_)], list_hash}, {1, 4},
                                     TensorOptions(DType::i64, device()));
  Tensor all = empty({size_, 4}, TensorOptions(DType::i64, device()));
  all_gather(all, mine);
  const std::vector<int64_t> flat =
      all.device().is_cpu() ? all.to_vector<int64_t>() : all.to(core::kCpu).to_vector<int64_t>();
  std::vector<SplitEntry> entries(static_cast<size_t>(size_));
  for (size_t p = 0; p < entries.size(); ++p)
    entries[p] = {flat[4 * p], flat[4 * p + 1], flat[4 * p + 2], flat[4 * p + 3]};

  for (size_t p = 1; p < entries.size(); ++p) {
    COLOSSAL_CHECK(entries[p].list_hash == entries[0].list_hash,
                   "new_group: rank {} and rank 0 passed different rank lists; every rank of the parent group must "
                   "pass the same list [{}]",
                   p, describe());
  }

  std::vector<int> members;  // parent ranks, in new-group rank order
  if (my_color >= 0) {
    for (int p = 0; p < size_; ++p) {
      if (entries[static_cast<size_t>(p)].color == my_color) members.push_back(p);
    }
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
      return entries[static_cast<size_t>(a)].key < entries[static_cast<size_t>(b)].key;
    });
  }

  std::shared_ptr<ProcessGroup> child = do_split(static_cast<int>(my_color), key);
  if (my_color < 0) {
    COLOSSAL_CHECK(child == nullptr, "split: the {} backend returned a group for a rank without a color",
                   backend_name());
    return nullptr;
  }
  COLOSSAL_CHECK(child != nullptr, "split: the {} backend returned no group for color {}", backend_name(), my_color);
  const auto expected_rank = std::find(members.begin(), members.end(), rank_) - members.begin();
  COLOSSAL_CHECK(child->size() == static_cast<int>(members.size()) && child->rank() == expected_rank,
                 "split: the {} backend made rank {} of {} where rank {} of {} was expected", backend_name(),
                 child->rank(), child->size(), expected_rank, members.size());
  std::vector<int> world;
  world.reserve(members.size());
  for (int p : members) world.push_back(static_cast<int>(entries[static_cast<size_t>(p)].global_rank));
  child->set_global_ranks(std::move(world));
  child->timeout_ = timeout_;
  return child;
}

}  // namespace colossal::comm
