// Whole attention heads per rank: see heads.h.
#include "colossal/parallel/tp/heads.h"

#include "colossal/core/error.h"

namespace colossal::parallel::tp {

std::vector<int64_t> head_qkv_columns(int64_t width, int64_t n_head, int rank, int size, std::string_view heads_key) {
  COLOSSAL_CHECK(n_head % size == 0,
                 "tensor-parallel attention: {} = {} heads do not split over parallel.tensor.size = {} ranks; "
                 "choose a tensor size that divides {}",
                 heads_key, n_head, size, n_head);
  const int64_t part = width / size;  // this rank's heads' columns in each of q, k and v
  std::vector<int64_t> columns;
  columns.reserve(static_cast<size_t>(3 * part));
  for (int64_t which = 0; which < 3; ++which) {
    for (int64_t c = 0; c < part; ++c) columns.push_back(which * width + rank * part + c);
  }
  return columns;
}

std::vector<int64_t> head_qkv_order(int64_t width, int64_t n_head, int size, std::string_view heads_key) {
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(3 * width));
  for (int r = 0; r < size; ++r) {
    const std::vector<int64_t> mine = head_qkv_columns(width, n_head, r, size, heads_key);
    order.insert(order.end(), mine.begin(), mine.end());
  }
  return order;
}

}  // namespace colossal::parallel::tp
