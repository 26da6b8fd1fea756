// parallel.tensor.sequence_parallel: read from TOML and --set, shown by describe(), and refused,
// naming the key and the values, where it cannot apply (no 1D tensor group to split the sequence
// over, or a data.seq_len the tensor ranks do not divide).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "colossal/config/train_config.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::config {
namespace {

TrainConfig parse(const std::string& toml, const std::vector<std::string>& overrides = {}) {
  return parse_config(toml, overrides, "test.toml");
}

TEST(SequenceParallelConfig, ReadFromTomlAndOverridesAndDescribed) {
  EXPECT_FALSE(parse("").parallel.tensor.sequence_parallel);
  const TrainConfig c =
      parse("[parallel]\ntensor = { mode = \"1d\", size = 2, sequence_parallel = true }\n[data]\nseq_len = 64\n");
  EXPECT_TRUE(c.parallel.tensor.sequence_parallel);
  EXPECT_NE(describe(c).find("sequence_parallel = true"), std::string::npos) << describe(c);
  EXPECT_TRUE(parse("[parallel]\ntensor = { size = 4 }\n", {"parallel.tensor.sequence_parallel=true"})
                  .parallel.tensor.sequence_parallel);
}

TEST(SequenceParallelConfig, NeedsAOneDimensionalTensorGroup) {
  EXPECT_ERROR_CONTAINS(parse("[parallel]\ntensor = { sequence_parallel = true }\n"),
                        "parallel.tensor.sequence_parallel = true needs parallel.tensor.mode = \"1d\" and "
                        "parallel.tensor.size > 1 (they are \"1d\" and 1)");
  EXPECT_ERROR_CONTAINS(parse("[parallel]\ntensor = { mode = \"2d\", size = 4, sequence_parallel = true }\n"),
                        "(they are \"2d\" and 4)");
}

TEST(SequenceParallelConfig, SequenceLengthMustSplitOverTheTensorRanks) {
  EXPECT_ERROR_CONTAINS(
      parse("[parallel]\ntensor = { size = 4, sequence_parallel = true }\n[data]\nseq_len = 30\n"),
      "data.seq_len = 30 does not divide by parallel.tensor.size = 4; choose a data.seq_len that is a multiple of 4");
}

}  // namespace
}  // namespace colossal::config
