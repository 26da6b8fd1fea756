// Tests of ParallelLayout (parallel/layout.h): rank decomposition, every group kind against rank
// lists written out by hand and against a line-by-line transcription of Colossal-AI's process-group
// initializers, the partition property, pipeline neighbours, validation messages and seeds.
#include "colossal/parallel/layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "colossal/core/error.h"
#include "colossal/parallel/layout_rules.h"

namespace colossal::parallel {
namespace {

using config::ParallelConfig;
using config::TensorParallelMode;
using Groups = std::vector<std::vector<int>>;

ParallelConfig make_config(int pipeline, int tensor_size, TensorParallelMode mode = TensorParallelMode::k1d,
                           int depth = 1) {
  ParallelConfig c;
  c.pipeline = pipeline;
  c.tensor.size = tensor_size;
  c.tensor.mode = mode;
  c.tensor.depth = depth;
  return c;
}

/// The message of the colossal::Error that building the layout throws ("" when it does not).
std::string error_of(const ParallelConfig& config, int world_size) {
  try {
    ParallelLayout layout(config, world_size);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ---- Colossal-AI's initializers, transcribed loop for loop -------------------------------------
// From hpcaitech/ColossalAI colossalai/legacy/context/process_group_initializer/initializer_*.py;
// world w, sizes dp, pp, tp. Each returns the groups in the order the initializer creates them.

Groups colossal_data(int w, int dp) {  // initializer_data.py
  Groups groups;
  const int num_group = w / dp;
  for (int i = 0; i < num_group; ++i) {
    std::vector<int> ranks;
    for (int j = 0; j < dp; ++j) ranks.push_back(i + j * num_group);
    groups.push_back(ranks);
  }
  return groups;
}

Groups colossal_pipeline(int w, int dp, int pp) {  // initializer_pipeline.py
  Groups groups;
  const int data_group_size = w / dp;
  const int pipeline_stage_size = data_group_size / pp;
  for (int i = 0; i < dp; ++i) {
    for (int j = 0; j < pipeline_stage_size; ++j) {
      std::vector<int> ranks;
      for (int r = i * data_group_size + j; r < (i + 1) * data_group_size; r += pipeline_stage_size) ranks.push_back(r);
      groups.push_back(ranks);
    }
  }
  return groups;
}

Groups colossal_blocks(int w, int block) {  // initializer_model.py (block pp*tp), initializer_1d.py (block tp)
  Groups groups;
  for (int i = 0; i < w / block; ++i) {
    std::vector<int> ranks;
    for (int j = 0; j < block; ++j) ranks.push_back(i * block + j);
    groups.push_back(ranks);
  }
  return groups;
}

Groups colossal_2d(int w, int tp, bool row) {  // initializer_2d.py
  Groups groups;
  const int q = tp == 1 ? 1 : static_cast<int>(std::lround(std::sqrt(tp)));
  for (int i = 0; i < w / tp; ++i) {
    for (int j = 0; j < q; ++j) {
      std::vector<int> ranks;
      for (int k = 0; k < q; ++k) ranks.push_back(row ? i * tp + j * q + k : i * tp + j + k * q);
      groups.push_back(ranks);
    }
  }
  return groups;
}

Groups colossal_2p5d(int w, int tp, int dep, GroupKind kind) {  // initializer_2p5d.py
  Groups groups;
  const int q = static_cast<int>(std::lround(std::sqrt(tp / dep)));
  const auto at = [&](int h, int i, int j, int k) { return h * tp + i + q * (j + q * k); };
  for (int h = 0; h < w / tp; ++h) {
    if (kind == GroupKind::k2p5dRow) {
      for (int j = 0; j < q; ++j)
        for (int k = 0; k < dep; ++k) {
          std::vector<int> ranks;
          for (int i = 0; i < q; ++i) ranks.push_back(at(h, i, j, k));
          groups.push_back(ranks);
        }
    } else if (kind == GroupKind::k2p5dCol) {
      for (int i = 0; i < q; ++i)
        for (int k = 0; k < dep; ++k) {
          std::vector<int> ranks;
          for (int j = 0; j < q; ++j) ranks.push_back(at(h, i, j, k));
          groups.push_back(ranks);
        }
    } else if (kind == GroupKind::k2p5dDep) {
      for (int i = 0; i < q; ++i)
        for (int j = 0; j < q; ++j) {
          std::vector<int> ranks;
          for (int k = 0; k < dep; ++k) ranks.push_back(at(h, i, j, k));
          groups.push_back(ranks);
        }
    } else {  // XZ
      for (int i = 0; i < q; ++i) {
        std::vector<int> ranks;
        for (int k = 0; k < dep; ++k)
          for (int j = 0; j < q; ++j) ranks.push_back(at(h, i, j, k));
        groups.push_back(ranks);
      }
    }
  }
  return groups;
}

Groups colossal_3d(int w, int tp, GroupKind kind) {  // initializer_3d.py
  Groups groups;
  const int d = static_cast<int>(std::lround(std::cbrt(tp)));
  const auto at = [&](int h, int i, int j, int k) { return h * d * d * d + i + d * (j + d * k); };
  for (int h = 0; h < w / tp; ++h) {
    switch (kind) {
      case GroupKind::k3dInput:
        for (int i = 0; i < d; ++i)
          for (int k = 0; k < d; ++k) {
            std::vector<int> ranks;
            for (int j = 0; j < d; ++j) ranks.push_back(at(h, i, j, k));
            groups.push_back(ranks);
          }
        break;
      case GroupKind::k3dWeight:
        for (int k = 0; k < d; ++k)
          for (int j = 0; j < d; ++j) {
            std::vector<int> ranks;
            for (int i = 0; i < d; ++i) ranks.push_back(at(h, i, j, k));
            groups.push_back(ranks);
          }
        break;
      case GroupKind::k3dOutput:
        for (int i = 0; i < d; ++i)
          for (int j = 0; j < d; ++j) {
            std::vector<int> ranks;
            for (int k = 0; k < d; ++k) ranks.push_back(at(h, i, j, k));
            groups.push_back(ranks);
          }
        break;
      case GroupKind::k3dInputXWeight:
        for (int k = 0; k < d; ++k) {
          std::vector<int> ranks;
          for (int j = 0; j < d; ++j)
            for (int i = 0; i < d; ++i) ranks.push_back(at(h, i, j, k));
          groups.push_back(ranks);
        }
        break;
      default:  // OutputXWeight
        for (int j = 0; j < d; ++j) {
          std::vector<int> ranks;
          for (int k = 0; k < d; ++k)
            for (int i = 0; i < d; ++i) ranks.push_back(at(h, i, j, k));
          groups.push_back(ranks);
        }
    }
  }
  return groups;
}

Groups colossal_groups(const ParallelLayout& l, GroupKind kind) {
  const int w = l.world_size(), tp = l.tensor_size();
  switch (kind) {
    case GroupKind::kData:
      return colossal_data(w, l.data_size());
    case GroupKind::kPipeline:
      return colossal_pipeline(w, l.data_size(), l.pipeline_size());
    case GroupKind::kModel:
      return colossal_blocks(w, l.pipeline_size() * tp);
    case GroupKind::kTensor:
      return colossal_blocks(w, tp);
    case GroupKind::k2dRow:
      return colossal_2d(w, tp, true);
    case GroupKind::k2dCol:
      return colossal_2d(w, tp, false);
    case GroupKind::k2p5dRow:
    case GroupKind::k2p5dCol:
    case GroupKind::k2p5dDep:
    case GroupKind::k2p5dXz:
      return colossal_2p5d(w, tp, l.tensor_grid_depth(), kind);
    default:
      return colossal_3d(w, tp, kind);
  }
}

// ---- rank decomposition ------------------------------------------------------------------------

TEST(ParallelLayout, RankIsDpTimesPpTpPlusPpTimesTpPlusTp) {
  for (int dp : {1, 2, 3}) {
    for (int pp : {1, 2, 4}) {
      for (int tp : {1, 2, 3, 8}) {
        const ParallelLayout layout(make_config(pp, tp), dp * pp * tp);
        EXPECT_EQ(layout.data_size(), dp);
        for (int rank = 0; rank < layout.world_size(); ++rank) {
          const RankCoords c = layout.coords(rank);
          EXPECT_EQ(c.dp * pp * tp + c.pp * tp + c.tp, rank);
          EXPECT_TRUE(c.tp < tp && c.pp < pp && c.dp < dp);
          EXPECT_EQ(layout.global_rank(c), rank);
        }
      }
    }
  }
}

TEST(ParallelLayout, ExplicitDataSizeMatchingTheWorldIsAccepted) {
  ParallelConfig c = make_config(2, 2);
  c.data = 3;
  EXPECT_EQ(ParallelLayout(c, 12).data_size(), 3);
}

TEST(ParallelLayout, OutOfRangeRanksAreRejected) {
  const ParallelLayout layout(make_config(2, 2), 8);
  EXPECT_THROW(layout.coords(8), Error);
  EXPECT_THROW(layout.coords(-1), Error);
  EXPECT_THROW(layout.global_rank({2, 0, 0}), Error);
  EXPECT_THROW(layout.group(GroupKind::k2dRow, 0), Error);  // a 1d layout has no 2d groups
}

// ---- groups written out by hand from Colossal-AI's formulas ------------------------------------

TEST(ParallelLayout, DataPipelineModelTensorGroupsOfDp2Pp2Tp2) {
  const ParallelLayout l(make_config(2, 2), 8);
  // data: [i + j * (pp*tp)]; pipeline: range(i*4 + j, (i+1)*4, 2); model: blocks of pp*tp.
  EXPECT_EQ(l.all_groups(GroupKind::kData), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.all_groups(GroupKind::kPipeline), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.all_groups(GroupKind::kModel), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(l.all_groups(GroupKind::kTensor), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.group(GroupKind::kData, 6), (std::vector<int>{2, 6}));
  EXPECT_EQ(l.rank_in_group(GroupKind::kData, 6), 1);
  EXPECT_EQ(l.group(GroupKind::kPipeline, 7), (std::vector<int>{5, 7}));
}

TEST(ParallelLayout, TwoDimensionalGroupsOfTp4Dp2) {
  const ParallelLayout l(make_config(1, 4, TensorParallelMode::k2d), 8);
  EXPECT_EQ(l.tensor_grid_dim(), 2);
  // Row: i*tp + j*q + k over k; column: i*tp + j + k*q over k.
  EXPECT_EQ(l.all_groups(GroupKind::k2dRow), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.all_groups(GroupKind::k2dCol), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.group(GroupKind::k2dRow, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(l.group(GroupKind::k2dCol, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(l.rank_in_group(GroupKind::k2dRow, 5), 1);
  EXPECT_EQ(l.rank_in_group(GroupKind::k2dCol, 5), 0);
}

TEST(ParallelLayout, TwoAndAHalfDimensionalGroupsOfTp8Depth2) {
  const ParallelLayout l(make_config(1, 8, TensorParallelMode::k2p5d, 2), 8);
  EXPECT_EQ(l.tensor_grid_dim(), 2);
  EXPECT_EQ(l.tensor_grid_depth(), 2);
  // Local rank i + q*(j + q*k); row varies i (loops j, k), col varies j (loops i, k), dep varies k
  // (loops i, j), xz varies j and k (loop i).
  EXPECT_EQ(l.all_groups(GroupKind::k2p5dRow), (Groups{{0, 1}, {4, 5}, {2, 3}, {6, 7}}));
  EXPECT_EQ(l.all_groups(GroupKind::k2p5dCol), (Groups{{0, 2}, {4, 6}, {1, 3}, {5, 7}}));
  EXPECT_EQ(l.all_groups(GroupKind::k2p5dDep), (Groups{{0, 4}, {2, 6}, {1, 5}, {3, 7}}));
  EXPECT_EQ(l.all_groups(GroupKind::k2p5dXz), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(l.group(GroupKind::k2p5dDep, 6), (std::vector<int>{2, 6}));
  EXPECT_EQ(l.group(GroupKind::k2p5dXz, 3), (std::vector<int>{1, 3, 5, 7}));
}

TEST(ParallelLayout, ThreeDimensionalGroupsOfTp8) {
  const ParallelLayout l(make_config(1, 8, TensorParallelMode::k3d), 8);
  EXPECT_EQ(l.tensor_grid_dim(), 2);
  // Local rank i + d*(j + d*k); input varies j, weight i, output k; input x weight is a k plane,
  // output x weight a j plane.
  EXPECT_EQ(l.all_groups(GroupKind::k3dInput), (Groups{{0, 2}, {4, 6}, {1, 3}, {5, 7}}));
  EXPECT_EQ(l.all_groups(GroupKind::k3dWeight), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.all_groups(GroupKind::k3dOutput), (Groups{{0, 4}, {2, 6}, {1, 5}, {3, 7}}));
  EXPECT_EQ(l.all_groups(GroupKind::k3dInputXWeight), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(l.all_groups(GroupKind::k3dOutputXWeight), (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(l.group(GroupKind::k3dOutputXWeight, 6), (std::vector<int>{2, 3, 6, 7}));
}

TEST(ParallelLayout, ThreeDimensionalGroupsUnderAPipelineStayInsideTheirTensorGroup) {
  // dp 1, pp 2, tp 8: the second stage's groups are the first's shifted by 8.
  const ParallelLayout l(make_config(2, 8, TensorParallelMode::k3d), 16);
  EXPECT_EQ(l.group(GroupKind::k3dInput, 9), (std::vector<int>{9, 11}));
  EXPECT_EQ(l.group(GroupKind::k3dOutputXWeight, 10), (std::vector<int>{10, 11, 14, 15}));
  EXPECT_EQ(l.group(GroupKind::kPipeline, 10), (std::vector<int>{2, 10}));
}

// ---- every layout against the transcribed initializers -----------------------------------------

std::vector<ParallelLayout> many_layouts() {
  std::vector<ParallelLayout> layouts;
  for (int dp : {1, 2, 3}) {
    for (int pp : {1, 2, 3}) {
      for (int tp : {1, 2, 4, 6}) layouts.emplace_back(make_config(pp, tp), dp * pp * tp);
      for (int tp : {1, 4, 9, 16}) layouts.emplace_back(make_config(pp, tp, TensorParallelMode::k2d), dp * pp * tp);
      for (auto [tp, depth] : {std::pair{8, 2}, {18, 2}, {12, 3}, {4, 1}})
        layouts.emplace_back(make_config(pp, tp, TensorParallelMode::k2p5d, depth), dp * pp * tp);
      for (int tp : {1, 8, 27}) layouts.emplace_back(make_config(pp, tp, TensorParallelMode::k3d), dp * pp * tp);
    }
  }
  return layouts;
}

std::string describe(const ParallelLayout& l) {
  return "world " + std::to_string(l.world_size()) + " dp " + std::to_string(l.data_size()) + " pp " +
         std::to_string(l.pipeline_size()) + " tp " + std::to_string(l.tensor_size()) + " grid " +
         std::to_string(l.tensor_grid_dim()) + "x" + std::to_string(l.tensor_grid_depth());
}

TEST(ParallelLayout, EveryGroupKindMatchesColossalAiInitializers) {
  for (const ParallelLayout& l : many_layouts()) {
    for (GroupKind kind : all_group_kinds()) {
      if (!l.has_group(kind)) continue;
      SCOPED_TRACE(describe(l) + " " + std::string(to_string(kind)));
      const Groups expected = colossal_groups(l, kind);
      ASSERT_EQ(l.all_groups(kind), expected);
      for (const std::vector<int>& g : expected) {
        for (size_t i = 0; i < g.size(); ++i) {
          ASSERT_EQ(l.group(kind, g[i]), g);
          ASSERT_EQ(l.rank_in_group(kind, g[i]), static_cast<int>(i));
        }
      }
    }
  }
}

TEST(ParallelLayout, EachRankIsInExactlyOneSortedGroupOfEachKind) {
  for (const ParallelLayout& l : many_layouts()) {
    for (GroupKind kind : all_group_kinds()) {
      if (!l.has_group(kind)) continue;
      SCOPED_TRACE(describe(l) + " " + std::string(to_string(kind)));
      std::vector<int> seen(l.world_size(), 0);
      size_t group_size = 0;
      for (const std::vector<int>& g : l.all_groups(kind)) {
        ASSERT_TRUE(std::is_sorted(g.begin(), g.end()));
        if (group_size == 0) group_size = g.size();
        ASSERT_EQ(g.size(), group_size);  // all groups of a kind have one size
        for (int rank : g) ++seen[rank];
      }
      ASSERT_EQ(std::count(seen.begin(), seen.end(), 1), l.world_size());
    }
  }
}

TEST(ParallelLayout, GroupSizesFollowTheGrid) {
  const ParallelLayout l(make_config(1, 18, TensorParallelMode::k2p5d, 2), 36);
  EXPECT_EQ(l.group(GroupKind::k2p5dRow, 20).size(), 3u);
  EXPECT_EQ(l.group(GroupKind::k2p5dCol, 20).size(), 3u);
  EXPECT_EQ(l.group(GroupKind::k2p5dDep, 20).size(), 2u);
  EXPECT_EQ(l.group(GroupKind::k2p5dXz, 20).size(), 6u);
  EXPECT_EQ(l.group(GroupKind::kData, 20).size(), 2u);
}

TEST(ParallelLayout, OnlyTheConfiguredModesGroupsExist) {
  const ParallelLayout l(make_config(1, 4, TensorParallelMode::k2d), 4);
  EXPECT_TRUE(l.has_group(GroupKind::kData));
  EXPECT_TRUE(l.has_group(GroupKind::kTensor));
  EXPECT_TRUE(l.has_group(GroupKind::k2dRow));
  EXPECT_FALSE(l.has_group(GroupKind::k2p5dRow));
  EXPECT_FALSE(l.has_group(GroupKind::k3dInput));
}

// ---- pipeline neighbours -----------------------------------------------------------------------

TEST(ParallelLayout, PipelineNeighboursFormARingWithinThePipelineGroup) {
  // dp 2, pp 4, tp 2: rank 11 is (dp 1, pp 1, tp 1); its pipeline group is 9, 11, 13, 15.
  const ParallelLayout l(make_config(4, 2), 16);
  EXPECT_EQ(l.group(GroupKind::kPipeline, 11), (std::vector<int>{9, 11, 13, 15}));
  EXPECT_EQ(l.pipeline_next(11), 13);
  EXPECT_EQ(l.pipeline_prev(11), 9);
  EXPECT_EQ(l.pipeline_next(15), 9);  // last stage wraps to the first
  EXPECT_EQ(l.pipeline_prev(9), 15);
  EXPECT_TRUE(l.is_first_stage(9));
  EXPECT_TRUE(l.is_last_stage(15));
  EXPECT_FALSE(l.is_last_stage(11));

  const ParallelLayout no_pipeline(make_config(1, 2), 4);
  EXPECT_EQ(no_pipeline.pipeline_next(3), 3);
  EXPECT_EQ(no_pipeline.pipeline_prev(3), 3);
}

// ---- validation --------------------------------------------------------------------------------

// The rules and their wording live in parallel/layout_rules.h (one check for config loading and for
// launch); ParallelLayout applies them with the world size.

TEST(ParallelLayoutValidation, TwoDimensionalNeedsASquare) {
  EXPECT_EQ(error_of(make_config(1, 6, TensorParallelMode::k2d), 6),
            "parallel.tensor.size = 6 does not suit parallel.tensor.mode = \"2d\", which needs a square (q*q): nearest "
            "valid sizes 4 or 9");
  EXPECT_EQ(error_of(make_config(1, 2, TensorParallelMode::k2d), 2),
            "parallel.tensor.size = 2 does not suit parallel.tensor.mode = \"2d\", which needs a square (q*q): nearest "
            "valid sizes 1 or 4");
}

TEST(ParallelLayoutValidation, TwoAndAHalfDimensionalNeedsDepthTimesASquare) {
  EXPECT_EQ(error_of(make_config(1, 12, TensorParallelMode::k2p5d, 2), 12),
            "parallel.tensor.size = 12 does not suit parallel.tensor.mode = \"2.5d\", which needs depth * q * q with "
            "parallel.tensor.depth = 2: nearest valid sizes 8 or 18");
  EXPECT_EQ(error_of(make_config(1, 4, TensorParallelMode::k2p5d, 0), 4), "parallel.tensor.depth = 0 must be >= 1");
  // One tensor rank splits nothing, so the depth does not matter.
  EXPECT_EQ(error_of(make_config(1, 1, TensorParallelMode::k2p5d, 2), 1), "");
}

TEST(ParallelLayoutValidation, ThreeDimensionalNeedsACube) {
  EXPECT_EQ(
      error_of(make_config(1, 16, TensorParallelMode::k3d), 16),
      "parallel.tensor.size = 16 does not suit parallel.tensor.mode = \"3d\", which needs a cube (d*d*d): nearest "
      "valid sizes 8 or 27");
  EXPECT_EQ(error_of(make_config(1, 4, TensorParallelMode::k3d), 4),
            "parallel.tensor.size = 4 does not suit parallel.tensor.mode = \"3d\", which needs a cube (d*d*d): nearest "
            "valid sizes 1 or 8");
}

TEST(ParallelLayoutValidation, WorldMustDivideByPipelineTimesTensor) {
  const std::string m = error_of(make_config(2, 4), 12);
  EXPECT_THAT(m, ::testing::HasSubstr("must be a multiple of parallel.pipeline * parallel.tensor.size = 2 * 4 = 8, "
                                      "but 12 processes were started"));
  EXPECT_THAT(m, ::testing::HasSubstr("colossal run --nproc_per_node 8 -- colossal train --config"));
  EXPECT_THAT(m, ::testing::HasSubstr("(nearest valid: 8 or 16), or choose pipeline and tensor sizes whose product "
                                      "divides 12"));
  EXPECT_THAT(error_of(make_config(1, 4), 2),
              ::testing::HasSubstr("parallel.tensor.size = 1 * 4 = 4, but 2 processes were started"));
}

TEST(ParallelLayoutValidation, ExplicitDataSizeMustFillTheWorld) {
  ParallelConfig c = make_config(2, 2);
  c.data = 3;
  const std::string m = error_of(c, 8);
  EXPECT_THAT(m, ::testing::HasSubstr("parallel.data = 3 with parallel.pipeline = 2 and parallel.tensor.size = 2 needs "
                                      "12 processes (data x pipeline x tensor), but 8 processes were started: start 12 "
                                      "processes"));
  EXPECT_THAT(m, ::testing::HasSubstr("or set parallel.data = 2 (or 0: derived from the processes started)"));
  c = make_config(1, 1);
  c.data = 2;
  EXPECT_THAT(error_of(c, 1), ::testing::HasSubstr(
                                  "needs 2 processes (data x pipeline x tensor), but this is a single process: start 2 "
                                  "processes: `colossal run --nproc_per_node 2"));
}

TEST(ParallelLayoutValidation, InterleavedScheduleNeedsMicrobatchesInRoundsOfStages) {
  ParallelConfig c = make_config(4, 1);
  c.num_chunks = 2;
  c.num_microbatches = 6;
  EXPECT_EQ(error_of(c, 4),
            "parallel.num_microbatches = 6 must be a multiple of parallel.pipeline = 4 for the interleaved schedule "
            "(parallel.num_chunks = 2): nearest valid 4 or 8");
  c.num_microbatches = 8;
  EXPECT_EQ(error_of(c, 4), "");
  ParallelConfig no_pipeline = make_config(1, 1);
  no_pipeline.num_chunks = 2;
  EXPECT_EQ(error_of(no_pipeline, 2),
            "parallel.num_chunks = 2 selects the interleaved pipeline schedule, which needs parallel.pipeline > 1");
}

TEST(ParallelLayoutValidation, SizesMustBePositive) {
  EXPECT_EQ(error_of(make_config(0, 1), 4), "parallel.pipeline = 0 must be >= 1");
  EXPECT_EQ(error_of(make_config(1, 0), 4), "parallel.tensor.size = 0 must be >= 1");
  EXPECT_EQ(error_of(make_config(1, 1), 0), "the world size must be at least 1 (got 0)");
  ParallelConfig c = make_config(1, 1);
  c.data = -1;
  EXPECT_EQ(error_of(c, 4), "parallel.data = -1 must be >= 0 (0: all the processes not used by pipeline and tensor)");
}

TEST(ParallelLayoutValidation, ConfigLoadingRunsTheSameRulesWithTheKeysOrigin) {
  // The rule config loading runs (without a world) gives the same wording, prefixed with where the key
  // was set.
  try {
    config::parse_config("[parallel.tensor]\nsize = 6\nmode = \"2d\"\n", {}, "test.toml", {layout_config_rule()});
    FAIL() << "a 2d tensor size of 6 loaded";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "test.toml:2: parallel.tensor.size = 6 does not suit parallel.tensor.mode = \"2d\", which needs a square "
              "(q*q): nearest valid sizes 4 or 9");
  }
  try {
    config::parse_config("[parallel]\npipeline = 2\nnum_microbatches = 4\n[data]\nbatch_size = 6\n", {}, "test.toml",
                         {layout_config_rule()});
    FAIL() << "a batch of 6 split into 4 microbatches loaded";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("test.toml:5: data.batch_size = 6 does not split into "
                                                            "parallel.num_microbatches = 4 equal microbatches"));
  }
}

// ---- seeds -------------------------------------------------------------------------------------

TEST(ParallelLayoutSeeds, DataSeedIsEqualOnEveryRankAndTensorSeedDiffersByTpRankAndStage) {
  // dp 2, pp 2, tp 2 with Colossal-AI's default seed 1024.
  const ParallelLayout l(make_config(2, 2), 8);
  std::map<int64_t, int> tensor_seed_count;
  for (int rank = 0; rank < 8; ++rank) {
    EXPECT_EQ(l.seed_for(SeedMode::kData, 1024, rank), 1024);
    const RankCoords c = l.coords(rank);
    // set_seed: seed + tp_rank + pipeline_rank * 1024.
    EXPECT_EQ(l.seed_for(SeedMode::kTensor, 1024, rank), 1024 + c.tp + 1024 * c.pp);
    ++tensor_seed_count[l.seed_for(SeedMode::kTensor, 1024, rank)];
  }
  // Four (pp, tp) positions, each shared by its two data-parallel replicas.
  EXPECT_EQ(tensor_seed_count.size(), 4u);
  for (const auto& [seed, count] : tensor_seed_count) EXPECT_EQ(count, 2) << seed;
  EXPECT_EQ(l.seed_for(SeedMode::kTensor, 7, 3), 7 + 1 + 1024);
}

}  // namespace
}  // namespace colossal::parallel
