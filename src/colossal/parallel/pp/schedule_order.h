// The order in which one pipeline stage runs the forward and backward passes of its microbatches:
// non-interleaved 1F1B (warm-up forwards, steady one-forward-one-backward, cool-down backwards) and
// interleaved 1F1B over model chunks, as Megatron-LM and Colossal-AI order them, and forward-only for
// evaluation. The pipeline schedules execute these lists; tests check them against hand-written
// orders and simulate whole pipelines to show they cannot deadlock.
//
// Note [Interleaved order]
// With v chunks per stage, the stage's virtual microbatches are numbered k = 0 .. m*v - 1 in groups
// of p*v (p stages): within a group, the first p are chunk 0 of microbatches g*p .. g*p + p - 1, the
// next p chunk 1 of the same microbatches, and so on; backward walks the chunks the other way round
// (chunk v - 1 first). Forward k runs chunk (k mod p*v) / p of microbatch (k / (p*v)) * p + k mod p.
// Warm-up runs (p - s - 1) * 2 + (v - 1) * p forwards on stage s (all of them when m == p), then
// forward k + warm-up alternates with backward k, then the remaining backwards. m must divide by p.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace colossal::parallel::pp {

struct PipelineOp {
  enum class Kind { forward, backward };
  Kind kind = Kind::forward;
  int64_t microbatch = 0;
  int chunk = 0;
  friend bool operator==(const PipelineOp&, const PipelineOp&) = default;
};

/// Non-interleaved 1F1B on stage `stage` of `num_stages` over `num_microbatches`: min(p - s - 1, m)
/// warm-up forwards, then forward / backward pairs, then the remaining backwards. At most
/// min(p - s, m) microbatches' activations are held at once.
std::vector<PipelineOp> one_f_one_b_order(int stage, int num_stages, int64_t num_microbatches);

/// Interleaved 1F1B (Note [Interleaved order]) with `num_chunks` model chunks per stage. Throws
/// naming the numbers when num_microbatches does not divide by num_stages.
std::vector<PipelineOp> interleaved_order(int stage, int num_stages, int64_t num_microbatches, int num_chunks);

/// The forwards interleaved_order runs before its first backward pair: (p - s - 1) * 2 + (v - 1) * p
/// (Note [Interleaved order]), all of them when num_microbatches == num_stages; min(p - s - 1, m) with
/// one chunk.
int64_t warmup_forwards(int stage, int num_stages, int64_t num_microbatches, int num_chunks);

/// Every microbatch forward through every chunk, in order, no backward (evaluation).
std::vector<PipelineOp> forward_only_order(int64_t num_microbatches, int num_chunks = 1);

/// The most microbatch-chunks whose forward has run and whose backward has not, over the order:
/// the activations a stage holds at its peak.
int64_t peak_in_flight(const std::vector<PipelineOp>& order);

/// "F0 F1 B0 F2 B1 ..." (chunk as ".c" when there are several) for logs and test failures.
std::string describe(const std::vector<PipelineOp>& order, int num_chunks = 1);

}  // namespace colossal::parallel::pp
