// Config: embedded default, lookup order (explicit > $TENSORDICT_CONFIG file > default), key errors.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <boost/test/unit_test.hpp>

#include "engine/zoo.hpp"
#include "tensordict/config.hpp"
#include "tensordict/errors.hpp"

using tensordict::Config;
using zoo::message_of;

namespace {
struct EnvFile {
  explicit EnvFile(const std::string& json) {
    path = std::string(TD_BINARY_DIR) + "/td_test_config_" + std::to_string(::getpid()) + ".json";
    std::ofstream(path) << json;
    ::setenv("TENSORDICT_CONFIG", path.c_str(), 1);
  }
  ~EnvFile() {
    ::unsetenv("TENSORDICT_CONFIG");
    std::remove(path.c_str());
  }
  std::string path;
};

}  // namespace

BOOST_AUTO_TEST_SUITE(config)

BOOST_AUTO_TEST_CASE(embedded_default) {
  ::unsetenv("TENSORDICT_CONFIG");
  Config c = Config::defaults();
  BOOST_TEST(std::string(Config::default_json()).find("\"scheduler\"") != std::string::npos);
  BOOST_TEST(c.scheduler_threads == 2);
  BOOST_TEST(c.scheduler_policy == "sharing");
  BOOST_TEST(c.map_num_workers == 2);
  BOOST_TEST(c.map_torch_threads_per_worker == 1);
  BOOST_TEST(c.redis_port == 6379);
  BOOST_TEST(c.shm_prefix == "tensordict_");
  BOOST_TEST(c.store_lanes == 3);
  BOOST_TEST(c.store_lane_retry_ms == 1000);
  BOOST_TEST(Config::load().to_json() == c.to_json());
  // to_json round-trips
  Config back = Config().overlay(c.to_json());
  BOOST_TEST(back.to_json() == c.to_json());
}

BOOST_AUTO_TEST_CASE(lookup_order) {
  EnvFile env(R"({"map": {"num_workers": 5, "progress": true}, "redis": {"port": 7000}})");
  Config from_env = Config::load();
  BOOST_TEST(from_env.map_num_workers == 5);   // file beats default
  BOOST_TEST(from_env.map_progress == true);
  BOOST_TEST(from_env.redis_port == 7000);
  BOOST_TEST(from_env.redis_host == "127.0.0.1");  // untouched keys keep the default
  Config both = Config::load(R"({"map": {"num_workers": 3}})");
  BOOST_TEST(both.map_num_workers == 3);       // explicit beats file
  BOOST_TEST(both.redis_port == 7000);         // file still beats default for the other keys
}

BOOST_AUTO_TEST_CASE(env_file_errors_name_file_and_key) {
  {
    EnvFile env(R"({"map": {"num_wrokers": 5}})");
    std::string m = message_of<tensordict::ValueError>([] { Config::load(); });
    BOOST_TEST(m.find("map.num_wrokers") != std::string::npos, m);
    BOOST_TEST(m.find(env.path) != std::string::npos, m);
  }
  ::setenv("TENSORDICT_CONFIG", "/nonexistent/td.json", 1);
  std::string m = message_of<tensordict::ValueError>([] { Config::load(); });
  ::unsetenv("TENSORDICT_CONFIG");
  BOOST_TEST(m.find("/nonexistent/td.json") != std::string::npos, m);
}

BOOST_AUTO_TEST_CASE(unknown_key_is_value_error) {
  std::string m = message_of<tensordict::ValueError>([] { Config::load(R"({"bogus": 1})"); });
  BOOST_TEST(m.find("'bogus'") != std::string::npos, m);
  m = message_of<tensordict::ValueError>([] { Config::load(R"({"redis": {"hots": "x"}})"); });
  BOOST_TEST(m.find("'redis.hots'") != std::string::npos, m);
}

BOOST_AUTO_TEST_CASE(wrong_type_is_type_error) {
  std::string m = message_of<tensordict::TypeError>([] { Config::load(R"({"map": {"num_workers": "4"}})"); });
  BOOST_TEST(m.find("'map.num_workers'") != std::string::npos, m);
  BOOST_TEST(m.find("integer") != std::string::npos, m);
  m = message_of<tensordict::TypeError>([] { Config::load(R"({"map": {"progress": 1}})"); });
  BOOST_TEST(m.find("'map.progress'") != std::string::npos, m);
  m = message_of<tensordict::TypeError>([] { Config::load(R"({"redis": 3})"); });
  BOOST_TEST(m.find("'redis'") != std::string::npos, m);
  m = message_of<tensordict::TypeError>([] { Config::load(R"({"log": {"level": 2}})"); });
  BOOST_TEST(m.find("'log.level'") != std::string::npos, m);
}

BOOST_AUTO_TEST_CASE(bad_values_and_json) {
  std::string m = message_of<tensordict::ValueError>([] { Config::load(R"({"scheduler": {"threads": 0}})"); });
  BOOST_TEST(m.find("'scheduler.threads'") != std::string::npos, m);
  m = message_of<tensordict::ValueError>([] { Config::load(R"({"store": {"lanes": -1}})"); });
  BOOST_TEST(m.find("'store.lanes'") != std::string::npos, m);
  m = message_of<tensordict::ValueError>([] { Config::load(R"({"store": {"lane_retry_ms": -5}})"); });
  BOOST_TEST(m.find("'store.lane_retry_ms'") != std::string::npos, m);
  m = message_of<tensordict::ValueError>([] { Config::load(R"({"log": {"level": "loud"}})"); });
  BOOST_TEST(m.find("'log.level'") != std::string::npos, m);
  BOOST_CHECK_THROW(Config::load("{not json"), tensordict::FormatError);
}

BOOST_AUTO_TEST_SUITE_END()
