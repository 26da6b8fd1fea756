// Vocabulary-parallel cross-entropy (Megatron-LM's vocab_parallel_cross_entropy): the loss of logits
// whose last dimension (the vocabulary) is split over the tensor-parallel group, without gathering
// them. Each rank holds the logits of vocabulary entries [r * V/tp, (r + 1) * V/tp); three scalar
// all-reduces per row give the softmax's maximum, its normaliser and the target's logit (which lives
// on one rank), and the backward is local: softmax minus the (smoothed) one-hot, on this rank's slice.
// For GPT-2 at 50304 padded entries, B16 x T1024, that is 3 x 16384 values communicated instead of
// 16384 x 50304 logits gathered.
#pragma once

#include "colossal/comm/process_group.h"
#include "colossal/core/tensor.h"
#include "colossal/ops/nn_functional.h"  // CrossEntropyOptions

namespace colossal::parallel::tp {

/// ops::cross_entropy(gathered logits, target, options) computed on the shards: `logits` [..., V/tp]
/// is this rank's slice of the vocabulary, `target` [...] the class indices into the whole
/// vocabulary (the same on every rank of `group`). Label smoothing spreads over the whole vocabulary
/// V = V/tp x tp (padding entries included, as a serial model's padded logits do); ignore_index rows
/// contribute nothing and are not counted by the mean. Returns the same value on every rank, in f32
/// for f16/bf16 logits (computed in f32, as the serial op), else in the logits' dtype; the gradient
/// of `logits` is this rank's slice of the serial gradient. Every rank of the group must call it.
/// `vocab_size` > 0: the vocabulary has that many entries and the logits' columns from it on (a
/// vocabulary padded to split over the group, VocabParallelEmbedding) are padding, left out of the
/// softmax and the smoothing, with zero gradient: the loss is the serial one over vocab_size classes.
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& target, comm::ProcessGroup& group,
                                    const ops::CrossEntropyOptions& options = {}, int64_t vocab_size = 0);

}  // namespace colossal::parallel::tp
