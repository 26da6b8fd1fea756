// ProgressBar: the rendered line (counts, percentage, rate, ETA, loss) and, into a file, one plain
// line per tenth of the pass plus the final one; a resumed pass counts from its first iteration.
#include "colossal/engine/progress_bar.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace colossal::engine {
namespace {

TEST(ProgressBar, RendersCountsRateEtaAndLoss) {
  ProgressBar bar("epoch 2/5 train", 200, 0, stderr, /*interactive=*/0);
  const std::string line = bar.render(50, 10.0, 0.12345);
  EXPECT_NE(line.find("epoch 2/5 train"), std::string::npos) << line;
  EXPECT_NE(line.find(" 50/200 "), std::string::npos) << line;
  EXPECT_NE(line.find(" 25% "), std::string::npos) << line;
  EXPECT_NE(line.find("5.00 it/s"), std::string::npos) << line;
  EXPECT_NE(line.find("ETA 00:30"), std::string::npos) << line;  // 150 left at 5 it/s
  EXPECT_NE(line.find("loss 0.1235"), std::string::npos) << line;
  EXPECT_NE(line.find("[======>"), std::string::npos) << line;  // a quarter of 24 columns
  const std::string no_loss = bar.render(50, 10.0, std::nan(""));
  EXPECT_EQ(no_loss.find("loss"), std::string::npos) << no_loss;
}

TEST(ProgressBar, FormatsDurations) {
  EXPECT_EQ(format_duration(0), "00:00");
  EXPECT_EQ(format_duration(61.4), "01:01");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_duration(std::nan("")), "--:--");
}

std::vector<std::string> lines_of(std::FILE* file) {
  std::rewind(file);
  std::vector<std::string> lines;
  char buffer[512];
  while (std::fgets(buffer, sizeof buffer, file) != nullptr) lines.emplace_back(buffer);
  return lines;
}

TEST(ProgressBar, IntoAFileOneLinePerTenthAndTheLast) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  int loss_reads = 0;
  {
    ProgressBar bar("epoch 1/1 train", 100, 0, file);  // not a terminal: plain lines
    for (int64_t done = 1; done <= 100; ++done) {
      bar.update(done, [&] {
        ++loss_reads;
        return 1.0 / static_cast<double>(done);
      });
    }
  }  // the destructor finishes the pass
  const std::vector<std::string> lines = lines_of(file);
  std::fclose(file);
  ASSERT_EQ(lines.size(), 10u);  // at 10, 20, ..., 90, then the final line at 100
  EXPECT_NE(lines[0].find(" 10/100 "), std::string::npos) << lines[0];
  EXPECT_NE(lines.back().find("100/100"), std::string::npos) << lines.back();
  EXPECT_NE(lines.back().find("loss 0.0100"), std::string::npos) << lines.back();
  EXPECT_EQ(loss_reads, 10);  // the loss is read only for drawn lines
}

TEST(ProgressBar, ResumedPassCountsFromItsFirstIteration) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  {
    ProgressBar bar("epoch 3/3 train", 100, 60, file);
    for (int64_t done = 61; done <= 100; ++done) bar.update(done, [] { return 0.5; });
  }
  const std::vector<std::string> lines = lines_of(file);
  std::fclose(file);
  ASSERT_EQ(lines.size(), 4u);  // at 70, 80, 90 and the final line
  EXPECT_NE(lines[0].find(" 70/100 "), std::string::npos) << lines[0];
}

}  // namespace
}  // namespace colossal::engine
