#pragma once
//! The library's logger: spdlog, to stderr, named "tensordict"; its level comes from the config (log.level).
#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace tensordict {

//! the "tensordict" logger (created on first use; shares spdlog's registry)
std::shared_ptr<spdlog::logger> logger();
//! "trace", "debug", "info", "warn", "error", "critical", "off"; ValueError otherwise
void set_log_level(const std::string& level);

}  // namespace tensordict
