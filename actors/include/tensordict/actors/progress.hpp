#pragma once
//! Progress of a map: a bar on stderr when stderr is a TTY, else a log line every `interval`; both with
//! the rate (chunks/s) and the ETA.
//! Not thread-safe: one owner (the map coordinator actor).
#include <chrono>
#include <cstdint>
#include <string>

namespace tensordict {
namespace actors {

//! one progress line: `label: done/total chunks (pct%), elapsed, rate chunks/s, ETA eta` (log form) or
//! `label [###---] done/total chunks elapsed, rate chunks/s, ETA eta` (bar form, bar_width > 0). The rate
//! and ETA read "-" until a chunk is done; the ETA is 0 at the end.
std::string progress_text(const std::string& label, int64_t done, int64_t total, double elapsed_s, int bar_width);

class Progress {
 public:
  Progress() = default;
  Progress(bool enabled, int64_t total, std::chrono::milliseconds interval, std::string label);
  void update(int64_t done);
  //! final line (newline after the bar); ok=false: "stopped"
  void finish(bool ok);
  bool enabled() const { return enabled_; }
  bool tty() const { return tty_; }

 private:
  void draw(int64_t done, bool final);
  bool enabled_ = false;
  bool tty_ = false;
  bool finished_ = false;
  int64_t total_ = 0;
  int64_t done_ = 0;
  std::chrono::milliseconds interval_{1000};
  std::string label_;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace actors
}  // namespace tensordict
