// What the tests that run the colossal program as a user does share: running a command with its
// output in a log, reading a file back, and a token file for the `tokens` dataset.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include <gtest/gtest.h>

namespace colossal::testing {

/// Runs `command` through the shell, stdout and stderr into `log`; returns the shell's status.
inline int run_logged(const std::string& command, const std::filesystem::path& log) {
  return std::system((command + " > '" + log.string() + "' 2>&1").c_str());
}

/// The whole file (empty when it cannot be read).
inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// `count` uint16 token ids spread over [0, vocab) (by default GPT-2's whole vocabulary, so both halves
/// of a vocabulary split over two tensor ranks are looked up).
inline void write_tokens(const std::filesystem::path& path, int count, int vocab = 50257) {
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < count; ++i) {
    const auto t = static_cast<uint16_t>((i * 7919 + (i * i) % 31) % vocab);
    const char bytes[2] = {static_cast<char>(t & 0xFF), static_cast<char>(t >> 8)};
    out.write(bytes, 2);
  }
}

/// Expects every step of `reference` (step -> loss, metrics_jsonl.h's step_losses) to have a loss in
/// `other` within `relative` of it (relative to the reference's); returns the largest relative
/// difference. `label` names `other` in a failure.
inline double expect_losses_within(const std::map<int64_t, double>& reference, const std::map<int64_t, double>& other,
                                   double relative, const std::string& label) {
  double worst = 0;
  for (const auto& [step, loss] : reference) {
    const auto found = other.find(step);
    if (found == other.end()) {
      ADD_FAILURE() << label << " has no loss at step " << step;
      continue;
    }
    const double error = std::abs(found->second - loss) / std::abs(loss);
    worst = std::max(worst, error);
    EXPECT_LE(error, relative) << "step " << step << ": " << label << " " << found->second << ", reference " << loss;
  }
  return worst;
}

}  // namespace colossal::testing
