// Whole attention heads per tensor-parallel rank: which columns of a fused q/k/v projection
// (q, then k, then v, each head's width in head order; GPT-2's c_attn, timm's qkv) a rank holds so
// that it can attend with its heads alone. Shared by the GPT-2 and ViT tensor-parallel attentions.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace colossal::parallel::tp {

/// The fused projection's output features that rank `rank` of `size` holds, in its order: its
/// heads' q, then their k, then their v. Throws naming both (and `heads_key`, how the user sets the
/// heads) when `n_head` does not divide by `size`.
std::vector<int64_t> head_qkv_columns(int64_t width, int64_t n_head, int rank, int size,
                                      std::string_view heads_key = "n_head");

/// Every rank's head_qkv_columns concatenated in rank order: the order a ColumnParallelLinear's
/// output features take so that rank r's contiguous part is its heads' q, k and v.
std::vector<int64_t> head_qkv_order(int64_t width, int64_t n_head, int size, std::string_view heads_key = "n_head");

}  // namespace colossal::parallel::tp
