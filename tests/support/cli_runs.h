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
#include <unistd.h>  // getpid

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

/// The --set options that shrink a GPT-2 config for a CPU run: two layers 32 wide with 4 heads (they
/// divide over 2 tensor ranks), windows of 16 tokens, dropout off (tensor ranks draw their own attention
/// masks), 4 test windows, 3 updates with every step logged and no progress bar, a warmup of 2.
inline constexpr const char* kTinyGpt2Sets =
    " --set train.device='\"cpu\"' --set data.seq_len=16 --set model.options.n_layer=2"
    " --set model.options.n_embd=32 --set model.options.n_head=4 --set model.options.dropout=0.0"
    " --set data.options.test_num_samples=4 --set train.max_steps=3 --set train.log_interval=1"
    " --set train.progress=false --set lr_scheduler.warmup_steps=2";

/// A fresh folder `name`_<pid> under the temporary directory holding train.bin (3000 tokens) and
/// val.bin (400) over GPT-2's vocabulary, with $DATA pointed at it: the token configs' data paths,
/// which ranks started by colossal run inherit.
inline std::filesystem::path token_run_dir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  write_tokens(dir / "train.bin", 3000);
  write_tokens(dir / "val.bin", 400);
  EXPECT_EQ(::setenv("DATA", dir.c_str(), 1), 0);
  return dir;
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
