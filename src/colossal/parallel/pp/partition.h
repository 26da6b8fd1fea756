// How a model's ordered pieces (nn/models' layers(): Note [Pipeline layers]) are cut among the
// pipeline's stages, each stage holding num_chunks model chunks for the interleaved schedule.
//
// Note [Pipeline parts]
// The pieces are cut into num_stages x num_chunks contiguous parts, in order; part j goes to stage
// j % num_stages as its chunk j / num_stages (Megatron's and Colossal-AI's interleaved placement:
// stage s holds parts s, s + p, s + 2p, ...). With one chunk, stage s simply holds part s.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace colossal::parallel::pp {

/// Pieces [begin, end) of the model's layers().
struct PieceRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  friend bool operator==(const PieceRange&, const PieceRange&) = default;
};

/// parts[stage][chunk]: the pieces of each stage's chunks (Note [Pipeline parts]).
using StageParts = std::vector<std::vector<PieceRange>>;

/// Colossal-AI's partition_uniform: the pieces are cut into num_chunks equal groups (num_items must
/// divide by num_chunks), and each group among the stages as evenly as whole pieces allow, the last
/// stages taking one piece more when it does not divide. Throws naming the numbers when num_items
/// does not divide by num_chunks or a stage would get no piece.
StageParts partition_uniform(int64_t num_items, int num_stages, int num_chunks = 1);

/// Balanced by weight (parameter counts: Colossal-AI's partition_balanced): the contiguous cut into
/// num_stages x num_chunks non-empty parts whose heaviest part is as light as possible; among those,
/// each part from the left is cut closest to an even share of the weight left (ties: the longer part).
/// Throws when there are fewer pieces than parts or a weight is negative or not finite.
StageParts partition_balanced(const std::vector<double>& weights, int num_stages, int num_chunks = 1);

/// Explicit sizes (the config's pieces per part, in part order: Note [Pipeline parts]): the sizes
/// must be positive, there must be num_stages x num_chunks of them, and they must add up to num_items.
/// Throws naming what is wrong.
StageParts partition_explicit(const std::vector<int64_t>& sizes, int64_t num_items, int num_stages, int num_chunks = 1);

/// "stage 0: [0, 7) [14, 21); stage 1: ..." for logs and errors.
std::string describe(const StageParts& parts);

}  // namespace colossal::parallel::pp
