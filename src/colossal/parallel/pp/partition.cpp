// Pipeline partitions: see partition.h.
#include "colossal/parallel/pp/partition.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "colossal/core/error.h"

namespace colossal::parallel::pp {
namespace {

void check_layout(int num_stages, int num_chunks, const char* op) {
  COLOSSAL_CHECK(num_stages >= 1, "{}: the number of pipeline stages must be >= 1, got {}", op, num_stages);
  COLOSSAL_CHECK(num_chunks >= 1, "{}: the number of model chunks per stage must be >= 1, got {}", op, num_chunks);
}

/// Parts in part order (Note [Pipeline parts]) placed on their stages.
StageParts place(const std::vector<PieceRange>& in_order, int num_stages, int num_chunks) {
  StageParts parts(static_cast<size_t>(num_stages));
  for (size_t j = 0; j < in_order.size(); ++j) parts[j % static_cast<size_t>(num_stages)].push_back(in_order[j]);
  for (auto& stage : parts) COLOSSAL_CHECK(static_cast<int>(stage.size()) == num_chunks, "pipeline parts misplaced");
  return parts;
}

}  // namespace

StageParts partition_uniform(int64_t num_items, int num_stages, int num_chunks) {
  check_layout(num_stages, num_chunks, "partition_uniform");
  COLOSSAL_CHECK(num_items >= 0 && num_items % num_chunks == 0,
                 "partition_uniform: {} pieces do not split into {} equal model chunks; use the balanced partition "
                 "or give the pieces per stage explicitly",
                 num_items, num_chunks);
  const int64_t per_chunk = num_items / num_chunks;
  COLOSSAL_CHECK(per_chunk >= num_stages,
                 "partition_uniform: {} pieces per model chunk leave some of the {} pipeline stages without a piece "
                 "(each needs at least one; {} pieces in {} chunks)",
                 per_chunk, num_stages, num_items, num_chunks);
  const int64_t base = per_chunk / num_stages;
  const int64_t first_longer = num_stages - per_chunk % num_stages;  // the last stages take the remainder
  std::vector<PieceRange> in_order;
  int64_t at = 0;
  for (int c = 0; c < num_chunks; ++c) {
    for (int s = 0; s < num_stages; ++s) {
      const int64_t size = base + (s >= first_longer ? 1 : 0);
      in_order.push_back({at, at + size});
      at += size;
    }
  }
  return place(in_order, num_stages, num_chunks);
}

StageParts partition_balanced(const std::vector<double>& weights, int num_stages, int num_chunks) {
  check_layout(num_stages, num_chunks, "partition_balanced");
  const auto n = static_cast<int64_t>(weights.size());
  const int64_t parts = int64_t{num_stages} * num_chunks;
  COLOSSAL_CHECK(n >= parts,
                 "partition_balanced: {} pieces cannot fill {} parts ({} stages x {} chunks): every part needs at "
                 "least one piece",
                 n, parts, num_stages, num_chunks);
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const double w = weights[static_cast<size_t>(i)];
    COLOSSAL_CHECK(std::isfinite(w) && w >= 0, "partition_balanced: piece {} has weight {}; weights must be >= 0", i,
                   w);
    prefix[static_cast<size_t>(i) + 1] = prefix[static_cast<size_t>(i)] + w;
  }
  const auto weight = [&](int64_t b, int64_t e) {
    return prefix[static_cast<size_t>(e)] - prefix[static_cast<size_t>(b)];
  };
  // best[k][i]: the lightest heaviest part when pieces [i, n) go into k non-empty parts.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(static_cast<size_t>(parts) + 1,
                                        std::vector<double>(static_cast<size_t>(n) + 1, kInf));
  best[0][static_cast<size_t>(n)] = 0.0;
  for (int64_t k = 1; k <= parts; ++k) {
    for (int64_t i = n - k; i >= 0; --i) {
      double value = kInf;
      for (int64_t e = i + 1; e <= n - (k - 1); ++e) {
        value = std::min(value, std::max(weight(i, e), best[static_cast<size_t>(k - 1)][static_cast<size_t>(e)]));
      }
      best[static_cast<size_t>(k)][static_cast<size_t>(i)] = value;
    }
  }
  const double bound = best[static_cast<size_t>(parts)][0];
  // Each part, from the left: of the ends that keep it and the rest within the bound, the one whose
  // weight is closest to an even share of what is left (ties: the longer part).
  std::vector<PieceRange> in_order;
  int64_t at = 0;
  for (int64_t k = parts; k >= 1; --k) {
    const double share = weight(at, n) / static_cast<double>(k);
    int64_t end = -1;
    double distance = kInf;
    for (int64_t e = at + 1; e <= n - (k - 1); ++e) {
      if (weight(at, e) > bound || best[static_cast<size_t>(k - 1)][static_cast<size_t>(e)] > bound) continue;
      const double d = std::abs(weight(at, e) - share);
      if (d <= distance) {
        distance = d;
        end = e;
      }
    }
    COLOSSAL_CHECK(end > at, "partition_balanced: no cut within the bound (internal error)");
    in_order.push_back({at, end});
    at = end;
  }
  return place(in_order, num_stages, num_chunks);
}

StageParts partition_explicit(const std::vector<int64_t>& sizes, int64_t num_items, int num_stages, int num_chunks) {
  check_layout(num_stages, num_chunks, "partition_explicit");
  const int64_t parts = int64_t{num_stages} * num_chunks;
  COLOSSAL_CHECK(static_cast<int64_t>(sizes.size()) == parts,
                 "pipeline pieces per part: {} sizes given, but {} stages x {} chunks need {}", sizes.size(),
                 num_stages, num_chunks, parts);
  std::vector<PieceRange> in_order;
  int64_t at = 0;
  for (size_t j = 0; j < sizes.size(); ++j) {
    COLOSSAL_CHECK(sizes[j] >= 1, "pipeline pieces per part: part {} has {} pieces; each needs at least one", j,
                   sizes[j]);
    in_order.push_back({at, at + sizes[j]});
    at += sizes[j];
  }
  COLOSSAL_CHECK(at == num_items, "pipeline pieces per part add up to {}, but the model has {} pieces", at, num_items);
  return place(in_order, num_stages, num_chunks);
}

std::string describe(const StageParts& parts) {
  std::string out;
  for (size_t s = 0; s < parts.size(); ++s) {
    if (s > 0) out += "; ";
    out += fmt::format("stage {}:", s);
    for (const PieceRange& r : parts[s]) out += fmt::format(" [{}, {})", r.begin, r.end);
  }
  return out;
}

}  // namespace colossal::parallel::pp
