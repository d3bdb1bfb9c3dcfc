#include "tensordict/logging.hpp"

#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

#include "tensordict/errors.hpp"

namespace tensordict {

std::shared_ptr<spdlog::logger> logger() {
  static std::mutex mu;
  static std::shared_ptr<spdlog::logger> lg;
  std::lock_guard<std::mutex> lock(mu);
  if (!lg) {
    lg = spdlog::get("tensordict");
    if (!lg) {
      lg = spdlog::stderr_color_mt("tensordict");
      lg->set_level(spdlog::level::warn);
    }
  }
  return lg;
}

void set_log_level(const std::string& level) {
  static const char* names[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  for (int i = 0; i < 7; ++i) {
    if (level == names[i]) {
      logger()->set_level(static_cast<spdlog::level::level_enum>(i));
      return;
    }
  }
  throw ValueError("config key 'log.level': expected one of trace, debug, info, warn, error, critical, off; got '" +
                   level + "'");
}

}  // namespace tensordict
