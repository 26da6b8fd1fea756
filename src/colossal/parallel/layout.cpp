// ParallelLayout: rank arithmetic of world = dp x pp x tp and the groups of each parallel mode.
// Rank lists follow Colossal-AI's process-group initializers, whose loops are cited per kind below
// (colossalai/legacy/context/process_group_initializer/ in hpcaitech/ColossalAI).
#include "colossal/parallel/layout.h"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <optional>
#include <string>

#include "colossal/core/error.h"  // colossal::Error, COLOSSAL_CHECK
#include "colossal/parallel/layout_rules.h"

namespace colossal::parallel {
namespace {

using config::TensorParallelMode;

// Note [Tensor-parallel grids]
// Within one tensor group (the tp consecutive ranks base .. base + tp - 1) Colossal-AI numbers the
// 2d, 2.5d and 3d grids the same way: local rank t = x0 + n0 * (x1 + n1 * x2), x0 innermost.
//   2d   (n0, n1, n2) = (q, q, 1):     row groups vary x0, column groups vary x1.
//   2.5d (q, q, depth), x0 = i "row", x1 = j "col", x2 = k "dep": row varies i, col varies j,
//        dep varies k, xz varies j and k (initializer_2p5d.py).
//   3d   (d, d, d), same i, j, k: input varies j, weight varies i, output varies k, input x
//        weight varies i and j, output x weight varies i and k (initializer_3d.py).
// Each group is listed with x0 innermost, which is Colossal-AI's order and also sorted. The groups
// of a kind are created looping over the fixed axes in the initializer's order (`loop_order`,
// outermost first), inside a loop over the tensor groups.
struct GridGroupSpec {
  std::array<bool, 3> varies;
  std::array<int, 3> loop_order;  ///< the fixed axes, outermost loop first; -1 pads
};

GridGroupSpec grid_spec(GroupKind kind) {
  switch (kind) {
    // initializer_2d.py: Initializer_2D_Row loops (i group, j), ranks j*q + k over k;
    // Initializer_2D_Col loops (i, j), ranks j + k*q over k.
    case GroupKind::k2dRow:
      return {{true, false, false}, {1, 2, -1}};
    case GroupKind::k2dCol:
      return {{false, true, false}, {0, 2, -1}};
    // initializer_2p5d.py: ROW loops (h, j, k) over i; Col (h, i, k) over j; Dep (h, i, j) over
    // k; XZ (h, i) over k then j.
    case GroupKind::k2p5dRow:
      return {{true, false, false}, {1, 2, -1}};
    case GroupKind::k2p5dCol:
      return {{false, true, false}, {0, 2, -1}};
    case GroupKind::k2p5dDep:
      return {{false, false, true}, {0, 1, -1}};
    case GroupKind::k2p5dXz:
      return {{false, true, true}, {0, -1, -1}};
    // initializer_3d.py: Input loops (h, i, k) over j; Weight (h, k, j) over i; Output (h, i, j)
    // over k; InputxWeight (h, k) over j then i; OutputxWeight (h, j) over k then i.
    case GroupKind::k3dInput:
      return {{false, true, false}, {0, 2, -1}};
    case GroupKind::k3dWeight:
      return {{true, false, false}, {2, 1, -1}};
    case GroupKind::k3dOutput:
      return {{false, false, true}, {0, 1, -1}};
    case GroupKind::k3dInputXWeight:
      return {{true, true, false}, {2, -1, -1}};
    case GroupKind::k3dOutputXWeight:
      return {{true, false, true}, {1, -1, -1}};
    default:
      COLOSSAL_FAIL("{} is not a tensor-parallel grid group", to_string(kind));
  }
}

std::optional<TensorParallelMode> mode_of(GroupKind kind) {
  switch (kind) {
    case GroupKind::k2dRow:
    case GroupKind::k2dCol:
      return TensorParallelMode::k2d;
    case GroupKind::k2p5dRow:
    case GroupKind::k2p5dCol:
    case GroupKind::k2p5dDep:
    case GroupKind::k2p5dXz:
      return TensorParallelMode::k2p5d;
    case GroupKind::k3dInput:
    case GroupKind::k3dWeight:
    case GroupKind::k3dOutput:
    case GroupKind::k3dInputXWeight:
    case GroupKind::k3dOutputXWeight:
      return TensorParallelMode::k3d;
    default:
      return std::nullopt;
  }
}

/// The integer n-th root of value when it is exact, else 0.
int exact_root(int value, int n) {
  const auto root = static_cast<int>(std::lround(std::pow(static_cast<double>(value), 1.0 / n)));
  int power = 1;
  for (int i = 0; i < n; ++i) power *= root;
  return power == value ? root : 0;
}

}  // namespace

std::string_view to_string(GroupKind kind) {
  switch (kind) {
    case GroupKind::kData:
      return "data";
    case GroupKind::kPipeline:
      return "pipeline";
    case GroupKind::kModel:
      return "model";
    case GroupKind::kTensor:
      return "tensor";
    case GroupKind::k2dRow:
      return "2d_row";
    case GroupKind::k2dCol:
      return "2d_col";
    case GroupKind::k2p5dRow:
      return "2.5d_row";
    case GroupKind::k2p5dCol:
      return "2.5d_col";
    case GroupKind::k2p5dDep:
      return "2.5d_dep";
    case GroupKind::k2p5dXz:
      return "2.5d_xz";
    case GroupKind::k3dInput:
      return "3d_input";
    case GroupKind::k3dWeight:
      return "3d_weight";
    case GroupKind::k3dOutput:
      return "3d_output";
    case GroupKind::k3dInputXWeight:
      return "3d_input_x_weight";
    case GroupKind::k3dOutputXWeight:
      return "3d_output_x_weight";
  }
  return "?";
}

const std::vector<GroupKind>& all_group_kinds() {
  // ParallelContext.init_parallel_groups: data, model, pipeline, tensor, then the mode's
  // initializer, whose groups come in its own order (2d: row, col; 2.5d: col, row, dep, xz; 3d:
  // input, weight, output, input x weight, output x weight).
  static const std::vector<GroupKind> kinds = {
      GroupKind::kData,     GroupKind::kModel,          GroupKind::kPipeline,        GroupKind::kTensor,
      GroupKind::k2dRow,    GroupKind::k2dCol,          GroupKind::k2p5dCol,         GroupKind::k2p5dRow,
      GroupKind::k2p5dDep,  GroupKind::k2p5dXz,         GroupKind::k3dInput,         GroupKind::k3dWeight,
      GroupKind::k3dOutput, GroupKind::k3dInputXWeight, GroupKind::k3dOutputXWeight,
  };
  return kinds;
}

ParallelLayout::ParallelLayout(const config::ParallelConfig& config, int world_size) {
  if (world_size < 1) throw Error(fmt::format("the world size must be at least 1 (got {})", world_size));
  require_layout(config, world_size);  // parallel/layout_rules.h: every rule, one wording
  const config::TensorParallelConfig& tensor = config.tensor;
  const int size = tensor.size;
  const int model_size = config.pipeline * size;
  // The grid of the tensor mode (the rules above made the roots exact).
  grid_dim_ = size;
  grid_depth_ = 1;
  switch (tensor.mode) {
    case TensorParallelMode::k1d:
      break;
    case TensorParallelMode::k2d:
      grid_dim_ = exact_root(size, 2);
      break;
    case TensorParallelMode::k2p5d:
      grid_dim_ = size == 1 ? 1 : exact_root(size / tensor.depth, 2);
      grid_depth_ = size == 1 ? 1 : tensor.depth;
      break;
    case TensorParallelMode::k3d:
      grid_dim_ = exact_root(size, 3);
      grid_depth_ = grid_dim_;
      break;
  }

  world_size_ = world_size;
  pipeline_size_ = config.pipeline;
  tensor_size_ = size;
  data_size_ = world_size / model_size;
  tensor_mode_ = tensor.mode;
  num_microbatches_ = config.num_microbatches;
  num_chunks_ = config.num_chunks;
}

void ParallelLayout::check_rank(int global_rank) const {
  COLOSSAL_CHECK(global_rank >= 0 && global_rank < world_size_, "rank {} is outside the world of {} ranks (0 to {})",
                 global_rank, world_size_, world_size_ - 1);
}

RankCoords ParallelLayout::coords(int global_rank) const {
  check_rank(global_rank);
  const int model_size = pipeline_size_ * tensor_size_;
  return {global_rank / model_size, global_rank % model_size / tensor_size_, global_rank % tensor_size_};
}

int ParallelLayout::global_rank(RankCoords c) const {
  COLOSSAL_CHECK(
      c.dp >= 0 && c.dp < data_size_ && c.pp >= 0 && c.pp < pipeline_size_ && c.tp >= 0 && c.tp < tensor_size_,
      "rank coordinates (dp {}, pp {}, tp {}) are outside the layout dp {} x pp {} x tp {}", c.dp, c.pp, c.tp,
      data_size_, pipeline_size_, tensor_size_);
  return (c.dp * pipeline_size_ + c.pp) * tensor_size_ + c.tp;
}

bool ParallelLayout::has_group(GroupKind kind) const {
  const auto mode = mode_of(kind);
  return !mode || *mode == tensor_mode_;
}

namespace {

/// The ranks of one grid group: the tensor group starting at `base`, the axes `spec.varies` free
/// and the others at `fixed` (Note [Tensor-parallel grids]); x0 innermost, so sorted.
std::vector<int> grid_group(int base, const std::array<int, 3>& dims, const GridGroupSpec& spec,
                            const std::array<int, 3>& fixed) {
  std::vector<int> ranks;
  const auto range = [&](int axis) {
    return spec.varies[axis] ? std::array{0, dims[axis]} : std::array{fixed[axis], fixed[axis] + 1};
  };
  const auto r2 = range(2), r1 = range(1), r0 = range(0);
  for (int x2 = r2[0]; x2 < r2[1]; ++x2)
    for (int x1 = r1[0]; x1 < r1[1]; ++x1)
      for (int x0 = r0[0]; x0 < r0[1]; ++x0) ranks.push_back(base + x0 + dims[0] * (x1 + dims[1] * x2));
  return ranks;
}

}  // namespace

std::vector<int> ParallelLayout::group(GroupKind kind, int global_rank) const {
  COLOSSAL_CHECK(has_group(kind), "the {} groups exist only with parallel.tensor.mode = \"{}\"; this layout is \"{}\"",
                 to_string(kind), config::to_string(*mode_of(kind)), config::to_string(tensor_mode_));
  const RankCoords c = coords(global_rank);
  std::vector<int> ranks;
  switch (kind) {
    case GroupKind::kData:
      for (int dp = 0; dp < data_size_; ++dp) ranks.push_back(this->global_rank({dp, c.pp, c.tp}));
      return ranks;
    case GroupKind::kPipeline:
      for (int pp = 0; pp < pipeline_size_; ++pp) ranks.push_back(this->global_rank({c.dp, pp, c.tp}));
      return ranks;
    case GroupKind::kModel:
      for (int r = 0; r < pipeline_size_ * tensor_size_; ++r) ranks.push_back(this->global_rank({c.dp, 0, 0}) + r);
      return ranks;
    case GroupKind::kTensor:
      for (int tp = 0; tp < tensor_size_; ++tp) ranks.push_back(global_rank - c.tp + tp);
      return ranks;
    default: {
      const std::array<int, 3> dims = {grid_dim_, grid_dim_, tensor_size_ / (grid_dim_ * grid_dim_)};
      const std::array<int, 3> x = {c.tp % dims[0], c.tp / dims[0] % dims[1], c.tp / (dims[0] * dims[1])};
      return grid_group(global_rank - c.tp, dims, grid_spec(kind), x);
    }
  }
}

int ParallelLayout::rank_in_group(GroupKind kind, int global_rank) const {
  const std::vector<int> ranks = group(kind, global_rank);
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] == global_rank) return static_cast<int>(i);
  }
  COLOSSAL_FAIL("rank {} is missing from its own {} group", global_rank, to_string(kind));
}

std::vector<std::vector<int>> ParallelLayout::all_groups(GroupKind kind) const {
  COLOSSAL_CHECK(has_group(kind), "the {} groups exist only with parallel.tensor.mode = \"{}\"; this layout is \"{}\"",
                 to_string(kind), config::to_string(*mode_of(kind)), config::to_string(tensor_mode_));
  std::vector<std::vector<int>> groups;
  const int model_size = pipeline_size_ * tensor_size_;
  switch (kind) {
    case GroupKind::kData:  // initializer_data.py: for i in range(pp*tp): [i + j*pp*tp for j]
      for (int r = 0; r < model_size; ++r) groups.push_back(group(kind, r));
      return groups;
    case GroupKind::kPipeline:  // initializer_pipeline.py: for dp i, for tp j
      for (int dp = 0; dp < data_size_; ++dp)
        for (int tp = 0; tp < tensor_size_; ++tp) groups.push_back(group(kind, global_rank({dp, 0, tp})));
      return groups;
    case GroupKind::kModel:  // initializer_model.py: one per replica
      for (int dp = 0; dp < data_size_; ++dp) groups.push_back(group(kind, dp * model_size));
      return groups;
    case GroupKind::kTensor:  // initializer_1d.py / initializer_tensor.py: consecutive blocks of tp
      for (int base = 0; base < world_size_; base += tensor_size_) groups.push_back(group(kind, base));
      return groups;
    default: {
      const GridGroupSpec spec = grid_spec(kind);
      const std::array<int, 3> dims = {grid_dim_, grid_dim_, tensor_size_ / (grid_dim_ * grid_dim_)};
      // Loop over the fixed axes in the initializer's order; an unused slot (-1) loops once.
      const auto extent = [&](int slot) { return spec.loop_order[slot] < 0 ? 1 : dims[spec.loop_order[slot]]; };
      for (int base = 0; base < world_size_; base += tensor_size_) {
        for (int a = 0; a < extent(0); ++a) {
          for (int b = 0; b < extent(1); ++b) {
            for (int c = 0; c < extent(2); ++c) {
              std::array<int, 3> fixed = {0, 0, 0};
              const std::array<int, 3> values = {a, b, c};
              for (int slot = 0; slot < 3; ++slot) {
                if (spec.loop_order[slot] >= 0) fixed[spec.loop_order[slot]] = values[slot];
              }
              groups.push_back(grid_group(base, dims, spec, fixed));
            }
          }
        }
      }
      return groups;
    }
  }
}

int ParallelLayout::pipeline_next(int global_rank) const {
  RankCoords c = coords(global_rank);
  c.pp = (c.pp + 1) % pipeline_size_;
  return this->global_rank(c);
}

int ParallelLayout::pipeline_prev(int global_rank) const {
  RankCoords c = coords(global_rank);
  c.pp = (c.pp + pipeline_size_ - 1) % pipeline_size_;
  return this->global_rank(c);
}

int64_t ParallelLayout::seed_for(SeedMode mode, int64_t base_seed, int global_rank) const {
  const RankCoords c = coords(global_rank);
  switch (mode) {
    case SeedMode::kData:
      return base_seed;
    // ParallelContext.set_seed (colossalai/legacy/context/parallel_context.py): tp_seed = seed +
    // tp_rank + pipeline_rank * 1024.
    case SeedMode::kTensor:
      return base_seed + c.tp + 1024 * static_cast<int64_t>(c.pp);
  }
  return base_seed;
}

}  // namespace colossal::parallel
