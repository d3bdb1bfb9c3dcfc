#include "tensordict/config.hpp"

#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include <rapidjson/document.h>
#include <rapidjson/error/en.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include "tensordict/errors.hpp"

namespace tensordict {
namespace config_detail {
extern const char* const kDefaultConfigJson;
}  // namespace config_detail

namespace {

enum class Kind { Int, Bool, String };

struct Field {
  Kind kind;
  int64_t Config::*i = nullptr;
  bool Config::*b = nullptr;
  std::string Config::*s = nullptr;
};

const std::map<std::string, Field>& fields() {
  static const std::map<std::string, Field> f = {
      {"scheduler.threads", {Kind::Int, &Config::scheduler_threads}},
      {"scheduler.policy", {Kind::String, nullptr, nullptr, &Config::scheduler_policy}},
      {"scheduler.spin_polls", {Kind::Int, &Config::scheduler_spin_polls}},
      {"scheduler.idle_sleep_us", {Kind::Int, &Config::scheduler_idle_sleep_us}},
      {"map.num_workers", {Kind::Int, &Config::map_num_workers}},
      {"map.torch_threads_per_worker", {Kind::Int, &Config::map_torch_threads_per_worker}},
      {"map.progress", {Kind::Bool, nullptr, &Config::map_progress}},
      {"map.progress_interval_ms", {Kind::Int, &Config::map_progress_interval_ms}},
      {"map.process_exit_grace_ms", {Kind::Int, &Config::map_process_exit_grace_ms}},
      {"map.out_write", {Kind::String, nullptr, nullptr, &Config::map_out_write}},
      {"shm.prefix", {Kind::String, nullptr, nullptr, &Config::shm_prefix}},
      {"redis.host", {Kind::String, nullptr, nullptr, &Config::redis_host}},
      {"redis.port", {Kind::Int, &Config::redis_port}},
      {"redis.db", {Kind::Int, &Config::redis_db}},
      {"redis.prefix", {Kind::String, nullptr, nullptr, &Config::redis_prefix}},
      {"redis.timeout_ms", {Kind::Int, &Config::redis_timeout_ms}},
      {"store.max_key_bytes", {Kind::Int, &Config::store_max_key_bytes}},
      {"store.lanes", {Kind::Int, &Config::store_lanes}},
      {"store.lane_retry_ms", {Kind::Int, &Config::store_lane_retry_ms}},
      {"log.level", {Kind::String, nullptr, nullptr, &Config::log_level}},
      {"request_timeout_ms", {Kind::Int, &Config::request_timeout_ms}},
      {"facade_spin_us", {Kind::Int, &Config::facade_spin_us}},
      {"actor_spin_us", {Kind::Int, &Config::actor_spin_us}},
      {"store_linger_us", {Kind::Int, &Config::store_linger_us}},
      {"malloc.keep_mb", {Kind::Int, &Config::malloc_keep_mb}},
      {"malloc.huge_page_min_kb", {Kind::Int, &Config::malloc_huge_page_min_kb}},
  };
  return f;
}

bool is_section(const std::string& path) {
  const std::string pre = path + ".";
  for (const auto& kv : fields())
    if (kv.first.compare(0, pre.size(), pre) == 0) return true;
  return false;
}

const char* json_type(const rapidjson::Value& v) {
  if (v.IsNull()) return "null";
  if (v.IsBool()) return "a boolean";
  if (v.IsInt64()) return "an integer";
  if (v.IsNumber()) return "a number";
  if (v.IsString()) return "a string";
  if (v.IsArray()) return "an array";
  return "an object";
}

void apply(Config& c, const rapidjson::Value& obj, const std::string& prefix, const std::string& origin) {
  for (auto it = obj.MemberBegin(); it != obj.MemberEnd(); ++it) {
    const std::string path = prefix + it->name.GetString();
    const rapidjson::Value& v = it->value;
    auto f = fields().find(path);
    if (f == fields().end()) {
      if (is_section(path)) {
        if (!v.IsObject()) {
          throw TypeError("config key '" + path + "' (" + origin + "): expected an object, got " + json_type(v));
        }
        apply(c, v, path + ".", origin);
        continue;
      }
      std::string known;
      for (const auto& kv : fields()) known += (known.empty() ? "" : ", ") + kv.first;
      throw ValueError("unknown config key '" + path + "' (" + origin + "); known keys: " + known);
    }
    switch (f->second.kind) {
      case Kind::Int:
        if (!v.IsInt64()) {
          throw TypeError("config key '" + path + "' (" + origin + "): expected an integer, got " + json_type(v));
        }
        c.*(f->second.i) = v.GetInt64();
        break;
      case Kind::Bool:
        if (!v.IsBool()) {
          throw TypeError("config key '" + path + "' (" + origin + "): expected a boolean, got " + json_type(v));
        }
        c.*(f->second.b) = v.GetBool();
        break;
      case Kind::String:
        if (!v.IsString()) {
          throw TypeError("config key '" + path + "' (" + origin + "): expected a string, got " + json_type(v));
        }
        c.*(f->second.s) = v.GetString();
        break;
    }
  }
}

}  // namespace

const char* Config::default_json() { return config_detail::kDefaultConfigJson; }

Config Config::overlay(const std::string& json, const std::string& origin) const {
  rapidjson::Document doc;
  doc.Parse<rapidjson::kParseCommentsFlag>(json.c_str(), json.size());
  if (doc.HasParseError()) {
    throw FormatError(origin + ": invalid JSON at offset " + std::to_string(doc.GetErrorOffset()) + ": " +
                      rapidjson::GetParseError_En(doc.GetParseError()));
  }
  if (!doc.IsObject()) throw TypeError(origin + ": expected a JSON object at the top level, got " + json_type(doc));
  Config c = *this;
  apply(c, doc, "", origin);
  c.validate();
  return c;
}

Config Config::overlay_file(const std::string& path) const {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ValueError("config file '" + path + "' cannot be opened");
  std::stringstream ss;
  ss << in.rdbuf();
  return overlay(ss.str(), "config file " + path);
}

Config Config::defaults() {
  static const Config d = Config().overlay(default_json(), "embedded default config");
  return d;
}

Config Config::load(const std::optional<std::string>& explicit_json) {
  Config c = defaults();
  if (const char* env = std::getenv("TENSORDICT_CONFIG")) {
    if (*env) {
      try {
        c = c.overlay_file(env);
      } catch (const ValueError& e) {
        std::string m = e.what();
        throw ValueError("TENSORDICT_CONFIG=" + std::string(env) + ": " + m.substr(m.find(' ') + 1));
      }
    }
  }
  if (explicit_json) c = c.overlay(*explicit_json, "explicit config");
  return c;
}

void Config::validate() const {
  auto positive = [](const char* key, int64_t v) {
    if (v <= 0) throw ValueError(std::string("config key '") + key + "': expected a positive integer, got " +
                                 std::to_string(v));
  };
  auto non_negative = [](const char* key, int64_t v) {
    if (v < 0) throw ValueError(std::string("config key '") + key + "': expected an integer >= 0, got " +
                                std::to_string(v));
  };
  positive("scheduler.threads", scheduler_threads);
  if (scheduler_policy != "sharing" && scheduler_policy != "stealing") {
    throw ValueError("config key 'scheduler.policy': expected \"sharing\" or \"stealing\", got \"" +
                     scheduler_policy + "\"");
  }
  non_negative("scheduler.spin_polls", scheduler_spin_polls);
  positive("scheduler.idle_sleep_us", scheduler_idle_sleep_us);
  positive("map.num_workers", map_num_workers);
  positive("map.torch_threads_per_worker", map_torch_threads_per_worker);
  non_negative("map.progress_interval_ms", map_progress_interval_ms);
  non_negative("map.process_exit_grace_ms", map_process_exit_grace_ms);
  if (map_out_write != "pwrite" && map_out_write != "populate" && map_out_write != "copy") {
    throw ValueError("config key 'map.out_write': expected \"pwrite\", \"populate\" or \"copy\", got \"" +
                     map_out_write + "\"");
  }
  if (redis_port <= 0 || redis_port > 65535) {
    throw ValueError("config key 'redis.port': expected 1..65535, got " + std::to_string(redis_port));
  }
  non_negative("redis.db", redis_db);
  if (redis_timeout_ms < 0 || redis_timeout_ms > 86400000) {
    throw ValueError("config key 'redis.timeout_ms': expected 0..86400000 (0: no timeout), got " +
                     std::to_string(redis_timeout_ms));
  }
  non_negative("store.max_key_bytes", store_max_key_bytes);
  non_negative("store.lanes", store_lanes);
  non_negative("store.lane_retry_ms", store_lane_retry_ms);
  static const char* levels[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  bool ok = false;
  for (auto l : levels) ok = ok || log_level == l;
  if (!ok) {
    throw ValueError("config key 'log.level': expected one of trace, debug, info, warn, error, critical, off; got \"" +
                     log_level + "\"");
  }
  positive("request_timeout_ms", request_timeout_ms);
  non_negative("facade_spin_us", facade_spin_us);
  non_negative("actor_spin_us", actor_spin_us);
  non_negative("store_linger_us", store_linger_us);
  if (malloc_keep_mb < 0 || malloc_keep_mb > 1024) {  // mallopt takes an int: at most 1 GiB
    throw ValueError("config key 'malloc.keep_mb': expected 0..1024, got " + std::to_string(malloc_keep_mb));
  }
  if (malloc_huge_page_min_kb < 0 || malloc_huge_page_min_kb > (int64_t{1} << 20)) {  // at most 1 GiB
    throw ValueError("config key 'malloc.huge_page_min_kb': expected 0..1048576, got " +
                     std::to_string(malloc_huge_page_min_kb));
  }
  if (shm_prefix.empty() || shm_prefix.size() > 200 || shm_prefix.find('/') != std::string::npos) {
    throw ValueError("config key 'shm.prefix': expected 1 to 200 characters without '/', got \"" + shm_prefix + "\"");
  }
}

std::string Config::to_json() const {
  rapidjson::StringBuffer buf;
  rapidjson::Writer<rapidjson::StringBuffer> w(buf);
  w.StartObject();
  std::string section;
  for (const auto& kv : fields()) {  // std::map: sorted, so a section's keys are adjacent
    const std::string& path = kv.first;
    auto dot = path.find('.');
    std::string sec = dot == std::string::npos ? "" : path.substr(0, dot);
    std::string key = dot == std::string::npos ? path : path.substr(dot + 1);
    if (sec != section) {
      if (!section.empty()) w.EndObject();
      if (!sec.empty()) {
        w.Key(sec.c_str());
        w.StartObject();
      }
      section = sec;
    }
    w.Key(key.c_str());
    switch (kv.second.kind) {
      case Kind::Int: w.Int64(this->*(kv.second.i)); break;
      case Kind::Bool: w.Bool(this->*(kv.second.b)); break;
      case Kind::String: w.String((this->*(kv.second.s)).c_str()); break;
    }
  }
  if (!section.empty()) w.EndObject();
  w.EndObject();
  return buf.GetString();
}

}  // namespace tensordict
