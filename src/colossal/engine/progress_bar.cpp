// ProgressBar: see progress_bar.h.
#include "colossal/engine/progress_bar.h"

#include <unistd.h>  // isatty

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace colossal::engine {
namespace {

constexpr int kBarWidth = 24;
constexpr double kRedrawSeconds = 0.1;

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
  return fmt::format("{:02d}:{:02d}", s / 60, s % 60);
}

ProgressBar::ProgressBar(std::string label, int64_t total, int64_t first, std::FILE* out, int interactive)
    : label_(std::move(label)),
      total_(total),
      first_(first),
      out_(out != nullptr ? out : stderr),
      interactive_(interactive >= 0 ? interactive != 0 : isatty(fileno(out_)) != 0),
      done_(first),
      last_loss_(std::numeric_limits<double>::quiet_NaN()),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {
  next_plain_ = first_ + std::max<int64_t>(1, total_ / 10);
}

ProgressBar::~ProgressBar() {
  finish();
}

bool ProgressBar::due() {
  if (interactive_) {
    const auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - last_draw_).count() < kRedrawSeconds) return false;
    last_draw_ = now;
    return true;
  }
  if (done_ < next_plain_) return false;
  next_plain_ = done_ + std::max<int64_t>(1, total_ / 10);
  return true;
}

std::string ProgressBar::render(int64_t done, double seconds, double loss) const {
  const int64_t run = done - first_;
  const double rate = seconds > 0 ? static_cast<double>(run) / seconds : 0.0;
  std::string line = label_;
  if (total_ > 0) {
    const double frac = std::clamp(static_cast<double>(done) / static_cast<double>(total_), 0.0, 1.0);
    const int filled = static_cast<int>(frac * kBarWidth);
    std::string bar(static_cast<size_t>(filled), '=');
    if (filled < kBarWidth) bar += '>';
    bar.resize(kBarWidth, ' ');
    const double eta = rate > 0 ? static_cast<double>(total_ - done) / rate : std::numeric_limits<double>::quiet_NaN();
    line += fmt::format(" {:>{}}/{} [{}] {:3.0f}% {:.2f} it/s ETA {}", done, std::to_string(total_).size(), total_, bar,
                        100 * frac, rate, format_duration(eta));
  } else {
    line += fmt::format(" {} {:.2f} it/s", done, rate);
  }
  line += fmt::format(" elapsed {}", format_duration(seconds));
  if (!std::isnan(loss)) line += fmt::format(" loss {:.4f}", loss);
  return line;
}

void ProgressBar::draw(double loss, bool final) {
  last_loss_ = loss;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const std::string line = render(done_, seconds, loss);
  if (interactive_) {
    // \x1b[K clears what a longer previous line left.
    fmt::print(out_, "\r{}\x1b[K{}", line, final ? "\n" : "");
  } else {
    fmt::print(out_, "{}\n", line);
  }
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  draw(last_loss_, true);
}

}  // namespace colossal::engine
