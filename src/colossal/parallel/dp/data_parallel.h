// DataParallel: Colossal-AI's (and torch DDP's) data parallelism for a model replicated on every rank
// of a group. At construction the parameters and buffers are broadcast from the group's rank 0; in
// backward each parameter's gradient-ready hook marks it in its bucket (about 25 MB of gradients,
// filled in reverse registration order, roughly the order backward produces them), and a full bucket
// is averaged over the group with an asynchronous all-reduce on the communication backend while
// backward goes on. finish() waits for the buckets and writes the averages back into the gradients.
// See Note [Bucket order] in data_parallel.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "colossal/comm/process_group.h"
#include "colossal/core/tensor.h"
#include "colossal/nn/module.h"
#include "colossal/parallel/dp/copy_engine_pair.h"  // PairReduction
#include "colossal/parallel/gradient_handler.h"

namespace colossal::parallel {

struct DataParallelOptions {
  /// Gradient bytes per bucket (Colossal-AI's and DDP's default: 25 MiB); a parameter larger than
  /// this gets a bucket of its own. The environment variable COLOSSAL_DP_BUCKET_MB, when set,
  /// overrides it (for measuring the overlap at other sizes).
  int64_t bucket_bytes = int64_t{25} << 20;
  /// Broadcast parameters and buffers from the group's rank 0 at construction, so every replica
  /// starts equal whatever each rank initialised.
  bool broadcast_parameters = true;
  /// Buckets (the last launched) whose parameters the update steps after the others, so that the
  /// others' update runs while these are still being reduced (finish_all_but_late, Note [Update
  /// beside the last reductions] in engine/engine.cpp); 0 steps everything after every reduction.
  /// The environment variable COLOSSAL_DP_LATE_BUCKETS, when set, overrides it.
  int late_buckets = 2;
  /// After the first synchronised backward, lay the buckets out again in the order the gradients
  /// became ready in it (rank 0's order, on every rank), as torch DDP rebuilds its buckets (Note
  /// [Buckets in the order gradients arrive] in data_parallel.cpp). False keeps the reverse
  /// registration order. The environment variable COLOSSAL_DP_REBUILD_BUCKETS (0 or 1), when set,
  /// overrides it.
  bool rebuild_buckets = true;
  /// Between the two GPUs of one host, reduce the buckets without NCCL's kernels (CopyEnginePair,
  /// Note [Copy-engine all-reduce of a GPU pair]), from the first step after the bucket rebuild. A
  /// group it cannot serve is an error naming why. Measured slower than NCCL on 2 H100s (session 17),
  /// hence NCCL. The environment variable COLOSSAL_DP_COPY_ENGINE, when set, overrides it: 0 NCCL, 1
  /// copy_engines, 2 direct_loads.
  PairReduction pair_reduction = PairReduction::nccl;
};

class DataParallel final : public GradientHandler {
 public:
  /// Buckets `model`'s trainable parameters (build it after any dtype or device conversion of the
  /// model: the hooks sit on the parameter tensors, see Note [Parameter slots] in nn/module.h).
  /// Every rank of `group` must construct it, with the same model structure.
  DataParallel(nn::Module& model, std::shared_ptr<comm::ProcessGroup> group, DataParallelOptions options = {});
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  /// Whether the next backward averages its gradients (true) or only accumulates them locally
  /// (gradient accumulation: DDP's no_sync). Gradients accumulated without sync are averaged, with the
  /// new ones, by the next synchronised backward.
  void set_sync(bool sync) override { sync_ = sync; }
  bool sync() const { return sync_; }

  /// Waits for every bucket of the last synchronised backward and writes the averaged gradients into
  /// the parameters' .grad. Buckets whose parameters got no gradient in that backward (unused
  /// parameters) are reduced here with zeros for the missing gradients. Call it after the backward and
  /// before clipping or the optimizer step; it does nothing after a backward without sync.
  void finish() override;
  /// Launches what finish() would, waits for every bucket but the last `late_buckets` and returns
  /// their parameters (none after a backward without sync, or with late_buckets = 0); finish() then
  /// waits for those.
  std::vector<Tensor> finish_all_but_late() override;

  /// Launches every bucket not launched yet (after a synchronised backward) and returns true: what
  /// finish() issues after this is only the first synchronised window's bucket rebuild, the same on
  /// every rank.
  bool issue_all() override;

  /// Broadcasts parameters and buffers from the group's rank 0 (done at construction by default).
  void broadcast_parameters();

  const comm::ProcessGroup& group() const override { return *group_; }
  /// The all-reduce leaves every replica the same averaged gradients.
  bool replicates_gradients() const override { return true; }
  std::string_view name() const override { return "data parallel (bucketed all-reduce)"; }
  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }
  /// The parameter names of each bucket, in launch order (for tests and logs).
  std::vector<std::vector<std::string>> bucket_names() const;
  /// Whether the buckets have been laid out in the order gradients arrive (rebuild_buckets).
  bool rebuilt() const { return rebuilt_; }

 private:
  struct Bucket;
  /// Fills buckets_ with the parameters params_[order[0]], params_[order[1]], ... (the size cap, a
  /// change of dtype and a parameter over the cap start a new bucket) and points locate_ at them.
  void build_buckets(const std::vector<size_t>& order);
  /// After the first synchronised backward: the buckets again, in the order its gradients arrived.
  void rebuild_in_arrival_order();
  void mark_ready(size_t param);
  void launch(size_t b);
  void launch_ready_in_order();
  /// Launches every bucket not launched yet (those with parameters that got no gradient), in order.
  void launch_the_rest();

  nn::Module& model_;
  std::shared_ptr<comm::ProcessGroup> group_;
  DataParallelOptions options_;
  /// The trainable parameters, in reverse registration order, and where each lies now.
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<size_t, size_t>> locate_;  // params_[i] -> (bucket, slot)
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::unique_ptr<CopyEnginePair> copy_engine_;  // set once the buckets are laid out for good (CUDA builds)
  std::vector<size_t> arrival_;  // params_ indices in the order the first synchronised backward marked them
  bool rebuilt_ = false;
  size_t next_launch_ = 0;  // buckets launch in index order on every rank
  bool sync_ = true;
  bool pending_ = false;  // a synchronised backward marked at least one parameter
};

}  // namespace colossal::parallel
