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
    if (tty_) std::fprintf(stderr, "%s: stopped\n", label_.c_str());
    else logger()->log(std::max(spdlog::level::info, logger()->level()), "{}: stopped", label_);
  }
}

void Progress::draw(int64_t done, bool final) {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double frac = total_ > 0 ? static_cast<double>(done) / static_cast<double>(total_) : 1.0;
  if (tty_) {
    constexpr int width = 30;
    const int fill = static_cast<int>(frac * width);
    std::string bar(static_cast<size_t>(fill), '#');
    bar.append(static_cast<size_t>(width - fill), '-');
    std::fprintf(stderr, "\r%s [%s] %lld/%lld chunks %.1fs%s", label_.c_str(), bar.c_str(),
                 static_cast<long long>(done), static_cast<long long>(total_), secs, final ? "\n" : "");
    std::fflush(stderr);
  } else {
    // asked for explicitly: shown even when log.level is above info (unless "off")
    auto lg = logger();
    if (lg->level() == spdlog::level::off) return;
    lg->log(std::max(spdlog::level::info, lg->level()), "{}: {}/{} chunks ({:.0f}%), {:.1f}s", label_, done, total_,
            frac * 100.0, secs);
  }
}

}  // namespace actors
}  // namespace tensordict
