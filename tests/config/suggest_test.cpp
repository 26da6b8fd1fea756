// Edit distance and the "did you mean" rule: typos are caught, unrelated names are not suggested.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "colossal/config/suggest.h"

namespace colossal::config {
namespace {

TEST(Suggest, EditDistance) {
  EXPECT_EQ(edit_distance("optimizer", "optimizer"), 0u);
  EXPECT_EQ(edit_distance("optimzer", "optimizer"), 1u);   // deletion
  EXPECT_EQ(edit_distance("optimiser", "optimizer"), 1u);  // substitution
  EXPECT_EQ(edit_distance("optmiizer", "optimizer"), 1u);  // two neighbours swapped
  EXPECT_EQ(edit_distance("TORCH", "torch"), 0u);          // case does not count
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
}

TEST(Suggest, NearestName) {
  const std::vector<std::string> sections = {"parallel", "fp16",      "zero",         "model",
                                             "data",     "optimizer", "lr_scheduler", "train"};
  EXPECT_EQ(nearest_name("optimzer", sections), "optimizer");
  EXPECT_EQ(nearest_name("lr_schedular", sections), "lr_scheduler");
  EXPECT_EQ(nearest_name("paralel", sections), "parallel");
  EXPECT_EQ(nearest_name("fp32", sections), std::nullopt);  // 2 edits in 4 letters: too far to guess
  EXPECT_EQ(nearest_name("logging", sections), std::nullopt);
  EXPECT_EQ(nearest_name("x", sections), std::nullopt);
}

TEST(Suggest, QuotedList) {
  const std::vector<std::string> names = {"a", "b"};
  EXPECT_EQ(quoted_list(names), "\"a\", \"b\"");
  EXPECT_EQ(quoted_list({}), "");
}

}  // namespace
}  // namespace colossal::config
