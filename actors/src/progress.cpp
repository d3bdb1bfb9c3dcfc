#include "tensordict/actors/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "tensordict/logging.hpp"

namespace tensordict {
namespace actors {

Progress::Progress(bool enabled, int64_t total, std::chrono::milliseconds interval, std::string label)
    : enabled_(enabled),
      tty_(enabled && isatty(STDERR_FILENO) == 1),
      total_(total),
      interval_(interval),
      label_(std::move(label)),
      start_(std::chrono::steady_clock::now()),
      last_(start_) {
  if (enabled_) draw(0, false);
}

void Progress::update(int64_t done) {
  done_ = done;
  if (!enabled_ || finished_) return;
  auto now = std::chrono::steady_clock::now();
  const auto period = tty_ ? std::chrono::milliseconds(100) : interval_;
  if (done < total_ && now - last_ < period) return;
  last_ = now;
  if (done >= total_) {
    finish(true);
  } else {
    draw(done, false);
  }
}

void Progress::finish(bool ok) {
  if (!enabled_ || finished_) return;
  finished_ = true;
  draw(done_, true);
  if (!ok) {
    if (tty_ || logger()->level() != spdlog::level::off) std::fprintf(stderr, "%s: stopped\n", label_.c_str());
  }
}

std::string progress_text(const std::string& label, int64_t done, int64_t total, double elapsed_s, int bar_width) {
  const double frac = total > 0 ? std::min(1.0, static_cast<double>(done) / static_cast<double>(total)) : 1.0;
  char rate[48] = "-", eta[48] = "-";
  if (done > 0 && elapsed_s > 0) {
    const double r = static_cast<double>(done) / elapsed_s;
    std::snprintf(rate, sizeof rate, r >= 100 ? "%.0f" : "%.2f", r);
    std::snprintf(eta, sizeof eta, "%.1fs", static_cast<double>(std::max<int64_t>(0, total - done)) / r);
  } else if (done >= total) {
    std::snprintf(eta, sizeof eta, "0.0s");
  }
  char line[512];
  if (bar_width > 0) {
    const int fill = static_cast<int>(frac * bar_width);
    std::string bar(static_cast<size_t>(fill), '#');
    bar.append(static_cast<size_t>(bar_width - fill), '-');
    std::snprintf(line, sizeof line, "%s [%s] %lld/%lld chunks %.1fs, %s chunks/s, ETA %s", label.c_str(), bar.c_str(),
                  static_cast<long long>(done), static_cast<long long>(total), elapsed_s, rate, eta);
  } else {
    std::snprintf(line, sizeof line, "%s: %lld/%lld chunks (%.0f%%), %.1fs, %s chunks/s, ETA %s", label.c_str(),
                  static_cast<long long>(done), static_cast<long long>(total), frac * 100.0, elapsed_s, rate, eta);
  }
  return line;
}

void Progress::draw(int64_t done, bool final) {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (tty_) {
    // \x1b[K clears what a longer previous line left
    std::fprintf(stderr, "\r%s\x1b[K%s", progress_text(label_, done, total_, secs, 30).c_str(), final ? "\n" : "");
    std::fflush(stderr);
  } else {
    // asked for explicitly: a plain progress line (not a log record: no level, which a warning-level logger would
    // have made "[warning]"), shown unless log.level is "off"
    if (logger()->level() == spdlog::level::off) return;
    std::fprintf(stderr, "%s\n", progress_text(label_, done, total_, secs, 0).c_str());
    std::fflush(stderr);
  }
}

}  // namespace actors
}  // namespace tensordict
