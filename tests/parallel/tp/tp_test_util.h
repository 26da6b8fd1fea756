// What the tensor-parallel layer tests share: the world as the tensor-parallel group, a relative
// error by norm, and a loss whose gradient is a fixed, varied tensor.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "../../comm/mpi_test_main.h"
#include "colossal/ops/elementwise.h"
#include "colossal/ops/reduction.h"

namespace colossal::parallel::tp::testing {

/// The MPI world (tests/comm/mpi_test_main.h) as the tensor-parallel group the layers hold.
inline std::shared_ptr<comm::ProcessGroup> tp_group() {
  return std::shared_ptr<comm::ProcessGroup>(&comm::testing::world(), [](comm::ProcessGroup*) {});
}

/// ||got - want|| / ||want|| over f64 values (both read as contiguous).
inline double relative_error(const Tensor& got, const Tensor& want) {
  const std::vector<double> g = got.contiguous().to_vector<double>(), w = want.contiguous().to_vector<double>();
  EXPECT_EQ(g.size(), w.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < w.size() && i < g.size(); ++i) {
    diff += (g[i] - w[i]) * (g[i] - w[i]);
    norm += w[i] * w[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-300);
}

/// sum(y * c) with c = cos(0.11 i): its gradient with respect to y is c, varied and fixed.
inline Tensor weighted_sum(const Tensor& y) {
  std::vector<double> c;
  for (int64_t i = 0; i < y.numel(); ++i) c.push_back(std::cos(0.11 * static_cast<double>(i)));
  return ops::sum(ops::mul(y, core::from_vector<double>(c, y.shape())));
}

}  // namespace colossal::parallel::tp::testing
