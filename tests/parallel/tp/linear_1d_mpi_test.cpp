// 1D tensor-parallel linear layers (parallel/tp/linear_1d.h) under MPI, the whole world as the
// tensor-parallel group (2 and 4 ranks): a column layer followed by a row layer (a transformer's
// MLP) computes the serial MLP's output, input gradient and, shard by shard, its weight gradients,
// in both weight layouts; a column layer that gathers its output and a row layer that scatters its
// input equal their serial layers alone; sizes that do not split are errors naming them.
//
// Tolerance: f64, 1e-12 relative by norm. The shards sum the same products as the serial GEMMs,
// split into tp partial sums added by the all-reduce: rounding of order 1e-16 per operation.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "../../comm/mpi_test_main.h"
#include "colossal/autograd/engine.h"
#include "colossal/autograd/grad_mode.h"
#include "colossal/core/error.h"
#include "colossal/core/random.h"
#include "colossal/nn/linear.h"
#include "colossal/ops/elementwise.h"
#include "colossal/ops/reduction.h"
#include "colossal/parallel/tp/linear_1d.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS
#include "tp_test_util.h"

namespace colossal::parallel::tp {
namespace {

using comm::testing::world;
using testing::relative_error;
using testing::tp_group;
using testing::weighted_sum;

constexpr double kTolerance = 1e-12;
constexpr int64_t kIn = 6, kHidden = 8, kOut = 4;

/// [2, 3, n] inputs that vary with everything, in f64, requiring grad.
Tensor input(int64_t n) {
  std::vector<double> v;
  for (int64_t i = 0; i < 2 * 3 * n; ++i) v.push_back(std::sin(0.37 * static_cast<double>(i) + 0.2));
  Tensor x = core::from_vector<double>(v, {2, 3, n});
  x.set_requires_grad(true);
  return x;
}

/// This rank's 1/size slice of `t` along `dim`.
Tensor my_slice(const Tensor& t, int dim) {
  const int64_t part = t.shape()[static_cast<size_t>(dim)] / world().size();
  return t.narrow(dim, world().rank() * part, part);
}

template <class Layer>
std::shared_ptr<Layer> serial_layer(int64_t in, int64_t out, uint64_t seed) {
  core::Generator g(seed);
  std::shared_ptr<Layer> layer;
  if constexpr (std::is_same_v<Layer, nn::Linear>) {
    layer = std::make_shared<nn::Linear>(in, out, true, &g);
  } else {
    layer = std::make_shared<nn::Conv1D>(in, out, &g);
    // Conv1D starts with a zero bias; give it values so the bias paths are checked.
    autograd::NoGradGuard no_grad;
    layer->bias().copy_(core::randn({out}, {}, &g));
  }
  layer->to(DType::f64);
  return layer;
}

template <class Layer>
void expect_mlp_equals_serial(int out_dim_of_weight, int64_t row_blocks = 1) {
  auto fc = serial_layer<Layer>(kIn, kHidden, 11);
  auto proj = serial_layer<Layer>(kHidden, kOut, 12);
  Tensor xs = input(kIn);
  Tensor ys = proj->forward(ops::gelu(fc->forward(xs)));
  autograd::backward(weighted_sum(ys));

  auto col = ColumnParallelLinear::from(*fc, tp_group());
  auto row = RowParallelLinear::from(*proj, tp_group());
  row->set_row_blocks(row_blocks);
  Tensor xp = input(kIn);
  Tensor yp = row->forward(ops::gelu(col->forward(xp)));
  autograd::backward(weighted_sum(yp));

  const int in_dim_of_weight = 1 - out_dim_of_weight;
  EXPECT_LE(relative_error(yp, ys), kTolerance) << "output";
  EXPECT_LE(relative_error(xp.grad(), xs.grad()), kTolerance) << "input gradient";
  EXPECT_LE(relative_error(col->weight().grad(), my_slice(fc->weight().grad(), out_dim_of_weight)), kTolerance)
      << "column shard's weight gradient";
  EXPECT_LE(relative_error(col->bias().grad(), my_slice(fc->bias().grad(), 0)), kTolerance)
      << "column shard's bias gradient";
  EXPECT_LE(relative_error(row->weight().grad(), my_slice(proj->weight().grad(), in_dim_of_weight)), kTolerance)
      << "row shard's weight gradient";
  EXPECT_LE(relative_error(row->bias().grad(), proj->bias().grad()), kTolerance) << "row layer's replicated bias";
}

TEST(Linear1d, ColumnThenRowEqualsTheSerialMlp) {
  expect_mlp_equals_serial<nn::Linear>(/*out_dim_of_weight=*/0);
}

TEST(Linear1d, ColumnThenRowEqualsTheSerialMlpInConv1dLayout) {
  expect_mlp_equals_serial<nn::Conv1D>(/*out_dim_of_weight=*/1);
}

// parallel.tensor.row_blocks (Note [Row blocks of a linear's output]): the row layer's GEMM over
// blocks of the 6 rows, each all-reduced as it is made, gives the serial MLP's output and gradients;
// 7 blocks of 6 rows are 6.
TEST(Linear1d, RowBlocksEqualTheSerialMlp) {
  for (int64_t blocks : {0, 2, 4, 6, 7}) {  // 0: chosen by size, 1 block for so small an output
    SCOPED_TRACE(blocks);
    expect_mlp_equals_serial<nn::Linear>(/*out_dim_of_weight=*/0, blocks);
    expect_mlp_equals_serial<nn::Conv1D>(/*out_dim_of_weight=*/1, blocks);
  }
  auto proj = serial_layer<nn::Linear>(kHidden, kOut, 12);
  auto row = RowParallelLinear::from(*proj, tp_group());
  EXPECT_ERROR_CONTAINS(row->set_row_blocks(-1), "parallel.tensor.row_blocks must be from 0 to 64");
  EXPECT_ERROR_CONTAINS(row->set_row_blocks(65), "parallel.tensor.row_blocks must be from 0 to 64");
}

// parallel.tensor.row_blocks = 0: 2 blocks from kAutoRowBlocksBytes of output on (GPT 1.3B's row
// layers at B8 T1024 in bf16 make exactly 32 MiB; GPT-2 350M's 16 MiB), else 1; an explicit count
// is kept whatever the size.
TEST(Linear1d, AutoRowBlocksByTheOutputsBytes) {
  EXPECT_EQ(auto_row_blocks(int64_t{8} * 1024 * 2048 * 2), 2);
  EXPECT_EQ(auto_row_blocks(int64_t{8} * 1024 * 1024 * 2), 1);
  EXPECT_EQ(auto_row_blocks(kAutoRowBlocksBytes - 1), 1);
  auto proj = serial_layer<nn::Linear>(kHidden, kOut, 12);
  auto row = RowParallelLinear::from(*proj, tp_group());
  const Tensor local = core::zeros({(kAutoRowBlocksBytes / 4 + kOut - 1) / kOut, row->in_features_per_rank()});
  row->set_row_blocks(0);
  EXPECT_EQ(row->blocks_for(local), 2);  // f32 rows of kOut features: just past 32 MiB
  EXPECT_EQ(row->blocks_for(local.narrow(0, 0, 3)), 1);
  row->set_row_blocks(3);
  EXPECT_EQ(row->blocks_for(local.narrow(0, 0, 3)), 3);
}

TEST(Linear1d, ColumnGatheringItsOutputEqualsTheSerialLayer) {
  auto serial = serial_layer<nn::Linear>(kIn, kOut, 21);
  Tensor xs = input(kIn);
  Tensor ys = serial->forward(xs);
  autograd::backward(weighted_sum(ys));
  auto col = ColumnParallelLinear::from(*serial, tp_group(), /*gather_output=*/true);
  EXPECT_EQ(col->out_features_per_rank(), kOut / world().size());
  Tensor xp = input(kIn);
  Tensor yp = col->forward(xp);
  autograd::backward(weighted_sum(yp));
  EXPECT_EQ(yp.shape(), ys.shape());
  EXPECT_LE(relative_error(yp, ys), kTolerance);
  EXPECT_LE(relative_error(xp.grad(), xs.grad()), kTolerance);
  EXPECT_LE(relative_error(col->weight().grad(), my_slice(serial->weight().grad(), 0)), kTolerance);
}

TEST(Linear1d, RowScatteringItsInputEqualsTheSerialLayer) {
  auto serial = serial_layer<nn::Conv1D>(kHidden, kOut, 31);
  Tensor xs = input(kHidden);
  Tensor ys = serial->forward(xs);
  autograd::backward(weighted_sum(ys));
  auto row = RowParallelLinear::from(*serial, tp_group(), /*input_is_parallel=*/false);
  Tensor xp = input(kHidden);
  Tensor yp = row->forward(xp);
  autograd::backward(weighted_sum(yp));
  EXPECT_LE(relative_error(yp, ys), kTolerance);
  EXPECT_LE(relative_error(xp.grad(), xs.grad()), kTolerance);
  EXPECT_LE(relative_error(row->weight().grad(), my_slice(serial->weight().grad(), 0)), kTolerance);
}

TEST(Linear1d, FeaturesThatDoNotSplitAreNamed) {
  const int64_t odd = world().size() + 1;  // never divisible by the group's size (>= 2)
  auto serial = serial_layer<nn::Linear>(kIn, odd, 41);
  EXPECT_ERROR_CONTAINS(ColumnParallelLinear::from(*serial, tp_group()),
                        "ColumnParallelLinear: the output features (" + std::to_string(odd) + " of them");
  auto wide = serial_layer<nn::Linear>(odd, kOut, 42);
  EXPECT_ERROR_CONTAINS(RowParallelLinear::from(*wide, tp_group()),
                        "RowParallelLinear: the input features (" + std::to_string(odd) + " of them");
  // A row layer given the whole input where it expects its slice says so.
  auto proj = serial_layer<nn::Linear>(kHidden, kOut, 43);
  auto row = RowParallelLinear::from(*proj, tp_group());
  EXPECT_ERROR_CONTAINS(row->forward(input(kHidden)), "input_is_parallel");
}

}  // namespace
}  // namespace colossal::parallel::tp

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
