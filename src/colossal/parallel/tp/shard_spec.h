// How a parameter lives on the tensor-parallel group: replicated (every rank holds the whole serial
// tensor) or sharded along one dimension (rank r holds the r-th of tp equal parts, after an optional
// reordering of that dimension, as attention's fused q/k/v columns need). The tensor-parallel layers
// declare their parameters' specs (Sharded); collect_shard_specs walks a model for them, and
// gather_shard / shard_of convert between a rank's part and the serial tensor, for the layout
// harness, the layout-independent checkpoints (engine/checkpoint_sharding.h) and the clipping norm.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "colossal/comm/process_group.h"
#include "colossal/core/tensor.h"
#include "colossal/nn/module.h"

namespace colossal::parallel::tp {

struct ShardSpec {
  /// The sharded dimension; -1: replicated over the group.
  int dim = -1;
  /// The serial tensor's indices along `dim` in the order the ranks' parts concatenate to (rank r
  /// takes order[r * n / tp, (r + 1) * n / tp)); empty: the natural order.
  std::vector<int64_t> order;
  /// The serial tensor's extent along `dim` when it need not divide by the group's size (a
  /// vocabulary): the parts then cover it rounded up to a multiple of the size, the rows past it zero
  /// padding that gather_shard drops. 0: the parts cover the serial extent exactly.
  int64_t size = 0;

  bool replicated() const { return dim < 0; }
  static ShardSpec replicate() { return {}; }
  static ShardSpec shard(int dim, std::vector<int64_t> order = {}) { return {dim, std::move(order), 0}; }
  /// Split along `dim` of serial extent `size`, padded at the end to a multiple of the group's size.
  static ShardSpec padded(int dim, int64_t size) { return {dim, {}, size}; }
  /// `size` rounded up to a multiple of `parts`: the padded extent the parts of a padded spec cover.
  static int64_t padded_size(int64_t size, int64_t parts) { return (size + parts - 1) / parts * parts; }
};

/// A module whose parameters (named as in its own named_parameters) live on the group in a way of
/// their own. Parameters it does not name are replicated.
class Sharded {
 public:
  virtual ~Sharded() = default;
  virtual std::map<std::string, ShardSpec> shard_specs() const = 0;
};

/// Every parameter of `model`, by its full name, with its spec (replicated unless a Sharded
/// module says otherwise).
std::map<std::string, ShardSpec> collect_shard_specs(nn::Module& model);

/// Rank `rank` of `size`'s part of the serial tensor `serial` (a copy; zero rows past a padded
/// spec's extent).
Tensor shard_of(const Tensor& serial, const ShardSpec& spec, int rank, int size);

/// The serial tensor from every rank's part `local` (all_gather over `group`, the order undone, a
/// padded spec's padding dropped); `local` itself for a replicated spec. Every rank of the group must call it.
Tensor gather_shard(const Tensor& local, const ShardSpec& spec, comm::ProcessGroup& group);

}  // namespace colossal::parallel::tp
