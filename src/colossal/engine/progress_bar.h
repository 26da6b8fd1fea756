// ProgressBar: the trainer's one-line view of a pass on rank 0: epoch, step/total, percentage,
// iterations per second, time left and the latest loss. On a terminal the line is redrawn in place
// (at most ten times a second); into a file or a pipe it prints a plain line every tenth of the
// pass instead, so logs stay readable.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace colossal::engine {

class ProgressBar {
 public:
  /// A pass named `label` ("epoch 1/10 train") of `total` iterations (0: unknown), starting at
  /// iteration `first` (a resumed pass), drawn to `out` (stderr by default). `interactive` chooses
  /// in-place redrawing; by default it is whether `out` is a terminal.
  ProgressBar(std::string label, int64_t total, int64_t first = 0, std::FILE* out = nullptr, int interactive = -1);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  /// Iteration `done` (1-based count of finished iterations) has finished. `loss` is read only when
  /// the line is drawn, so a GPU loss costs one synchronisation per redraw, not per step.
  template <class LossFn>
  void update(int64_t done, LossFn&& loss) {
    done_ = done;
    if (total_ > 0 && done >= total_) {
      last_loss_ = static_cast<double>(loss());  // finish() draws the last line
    } else if (due()) {
      draw(static_cast<double>(loss()), false);
    }
  }
  /// Draws the final line of the pass and ends it.
  void finish();

  /// The line as drawn for `done` iterations after `seconds`, with `loss` (NaN: none shown).
  std::string render(int64_t done, double seconds, double loss) const;

 private:
  bool due();
  void draw(double loss, bool final);

  std::string label_;
  int64_t total_;
  int64_t first_;
  std::FILE* out_;
  bool interactive_;
  bool finished_ = false;
  int64_t done_ = 0;
  double last_loss_;
  int64_t next_plain_ = 0;  // the iteration at which a plain (non-terminal) line is next due
  std::chrono::steady_clock::time_point start_, last_draw_;
};

/// "1:02:03" or "02:03" for a non-negative number of seconds.
std::string format_duration(double seconds);

}  // namespace colossal::engine
