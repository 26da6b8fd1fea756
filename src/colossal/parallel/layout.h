// ParallelLayout: where each global rank sits in world = dp x pp x tp and which ranks it shares a
// process group with, for every group kind Colossal-AI creates (data, pipeline, model, tensor and
// the 2d / 2.5d / 3d tensor-parallel groups), plus the per-mode seeds. Pure arithmetic, no
// communication: ParallelContext turns these rank lists into process groups.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "colossal/config/train_config.h"  // ParallelConfig, TensorParallelMode

namespace colossal::parallel {

/// A kind of process group. Each global rank belongs to exactly one group of every kind its
/// layout has (has_group). The rank lists match Colossal-AI's process-group initializers
/// (colossalai/legacy/context/process_group_initializer/initializer_*.py).
enum class GroupKind {
  kData,             ///< same pp and tp rank, one rank per replica: gradients are reduced here (initializer_data.py)
  kPipeline,         ///< same dp and tp rank, one rank per stage (initializer_pipeline.py)
  kModel,            ///< same dp rank: the pp*tp ranks of one model replica (initializer_model.py)
  kTensor,           ///< same dp and pp rank: the tp ranks that split one layer; the 1d group (initializer_1d.py)
  k2dRow,            ///< 2d: the q ranks of one row of the q x q grid (initializer_2d.py, PARALLEL_2D_ROW)
  k2dCol,            ///< 2d: the q ranks of one column (PARALLEL_2D_COL)
  k2p5dRow,          ///< 2.5d: the q ranks of one row of one depth layer (initializer_2p5d.py, PARALLEL_2P5D_ROW)
  k2p5dCol,          ///< 2.5d: the q ranks of one column of one depth layer (PARALLEL_2P5D_COL)
  k2p5dDep,          ///< 2.5d: the depth ranks at one grid position across the layers (PARALLEL_2P5D_DEP)
  k2p5dXz,           ///< 2.5d: the q*depth ranks of one row index across all layers (PARALLEL_2P5D_XZ)
  k3dInput,          ///< 3d: d ranks along the cube's j axis (initializer_3d.py, PARALLEL_3D_INPUT)
  k3dWeight,         ///< 3d: d ranks along the i axis (PARALLEL_3D_WEIGHT)
  k3dOutput,         ///< 3d: d ranks along the k axis (PARALLEL_3D_OUTPUT)
  k3dInputXWeight,   ///< 3d: the d*d ranks of one k plane (PARALLEL_3D_INPUT_X_WEIGHT)
  k3dOutputXWeight,  ///< 3d: the d*d ranks of one j plane (PARALLEL_3D_OUTPUT_X_WEIGHT)
};

/// "data", "pipeline", "2d_row", "3d_input_x_weight", ...
std::string_view to_string(GroupKind kind);

/// Every group kind, in the order Colossal-AI's ParallelContext creates them (data, model,
/// pipeline, tensor, then the mode's groups); filter with ParallelLayout::has_group.
const std::vector<GroupKind>& all_group_kinds();

/// A rank's coordinates: global_rank = dp * (pp_size * tp_size) + pp * tp_size + tp.
struct RankCoords {
  int dp = 0;
  int pp = 0;
  int tp = 0;

  friend bool operator==(const RankCoords&, const RankCoords&) = default;
};

/// Which random stream a seed is for (Colossal-AI's seed modes, ParallelContext.set_seed).
enum class SeedMode {
  kData,    ///< equal on every rank: data order, and initialisation of replicated parameters
  kTensor,  ///< differs by tp rank (and pipeline stage): dropout and init of tensor-parallel shards
};

class ParallelLayout {
 public:
  /// Validates config against world_size and derives the data-parallel size (config.data = 0:
  /// world_size / (pipeline * tensor.size)). Throws colossal::Error naming the rule broken and the
  /// nearest valid sizes, e.g. `parallel.tensor.size = 6 with mode "2d" must be a square (q*q);
  /// nearest: 4 or 9`.
  ParallelLayout(const config::ParallelConfig& config, int world_size);

  int world_size() const { return world_size_; }
  int data_size() const { return data_size_; }
  int pipeline_size() const { return pipeline_size_; }
  int tensor_size() const { return tensor_size_; }
  config::TensorParallelMode tensor_mode() const { return tensor_mode_; }
  int num_microbatches() const { return num_microbatches_; }
  int num_chunks() const { return num_chunks_; }
  /// 2d: q of the q x q grid; 2.5d: q of each q x q layer ("tesseract dim"); 3d: d of the d^3
  /// cube; 1d: tensor_size.
  int tensor_grid_dim() const { return grid_dim_; }
  /// 2.5d: the number of stacked layers ("tesseract depth"); 1 for the other modes.
  int tensor_grid_depth() const { return grid_depth_; }

  RankCoords coords(int global_rank) const;
  int global_rank(RankCoords coords) const;

  /// Whether this layout has groups of `kind`: data, pipeline, model and tensor always (of size 1
  /// when that dimension is not split); the 2d / 2.5d / 3d kinds under their tensor mode only.
  bool has_group(GroupKind kind) const;
  /// The sorted global ranks of the `kind` group holding global_rank; its position in the list is
  /// the rank's local rank in that group, as in Colossal-AI.
  std::vector<int> group(GroupKind kind, int global_rank) const;
  /// global_rank's local rank in its `kind` group (its index in group(kind, global_rank)).
  int rank_in_group(GroupKind kind, int global_rank) const;
  /// Every group of `kind` across the world, in Colossal-AI's creation order. Every rank creating
  /// groups collectively (MPI_Comm_split, ncclCommSplit) must walk this same list.
  std::vector<std::vector<int>> all_groups(GroupKind kind) const;

  /// The next and previous stage's rank in global_rank's pipeline group, wrapping around (a ring,
  /// like Colossal-AI's get_next_global_rank / get_prev_global_rank); global_rank itself when pp = 1.
  int pipeline_next(int global_rank) const;
  int pipeline_prev(int global_rank) const;
  bool is_first_stage(int global_rank) const { return coords(global_rank).pp == 0; }
  bool is_last_stage(int global_rank) const { return coords(global_rank).pp == pipeline_size_ - 1; }

  /// The seed of `mode`'s random stream on global_rank, from the run's base seed. As Colossal-AI's
  /// ParallelContext.set_seed: data = base_seed on every rank; tensor = base_seed + tp_rank +
  /// 1024 * pp_rank, so tp shards draw different dropout masks and stages differ too.
  int64_t seed_for(SeedMode mode, int64_t base_seed, int global_rank) const;

 private:
  void check_rank(int global_rank) const;

  int world_size_ = 1;
  int data_size_ = 1;
  int pipeline_size_ = 1;
  int tensor_size_ = 1;
  config::TensorParallelMode tensor_mode_ = config::TensorParallelMode::k1d;
  int grid_dim_ = 1;
  int grid_depth_ = 1;
  int num_microbatches_ = 1;
  int num_chunks_ = 1;
};

}  // namespace colossal::parallel
