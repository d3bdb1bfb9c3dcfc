#pragma once
// Helpers of the Redis store suites (backends.redis_store, backends.redis_store_secrets).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include <boost/test/unit_test.hpp>

#include "backends/backends_test_util.hpp"
#include "redis_server.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/backends/redis_store.hpp"
#include "tensordict/errors.hpp"

using namespace tensordict;
using namespace tensordict::backends;

// each suite uses a part of these helpers
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-variable"
namespace {

//! one server for the whole suite (tests use fresh td_ids); the failure tests start their own
testutil::RedisServer& shared_server() {
  static testutil::RedisServer server;
  return server;
}

RedisOptions opts(const testutil::RedisServer& s) { return RedisOptions().host("127.0.0.1").port(s.port()); }

std::shared_ptr<RedisStore> new_store(const std::vector<int64_t>& batch = {4}) {
  auto s = std::dynamic_pointer_cast<RedisStore>(create_redis_store(opts(shared_server()), batch));
  BOOST_TEST_REQUIRE(s != nullptr);
  return s;
}

template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    BOOST_FAIL("wrong exception type: " << e.what());
  }
  BOOST_FAIL("no exception thrown");
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string raw_bytes(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.nbytes()));
}

bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && raw_bytes(a) == raw_bytes(b);
}

at::Tensor sample(at::ScalarType dt, std::vector<int64_t> shape) {
  at::Tensor base = at::arange(static_cast<double>(c10::multiply_integers(shape)), at::kDouble).reshape(shape);
  if (dt == at::kBool) return (base.fmod(3) == 1);
  if (dt == at::kComplexFloat || dt == at::kComplexDouble)
    return at::complex(base - 2.5, base * 0.5).to(dt);
  if (dt == at::kByte) return base.fmod(251).to(dt);
  if (dt == at::kChar) return (base.fmod(200) - 100).to(dt);
  return (base * 1.5 - 7).to(dt);
}

std::vector<std::string> keys_of(RedisClient& c, const std::string& prefix, const std::string& td_id) {
  RedisReply r = c.command(RedisCommand{"KEYS", prefix + ":{" + td_id + "}:*"});
  std::vector<std::string> out;
  for (auto& e : r.elements) out.push_back(e.str.substr(prefix.size() + td_id.size() + 4));  // "p:{id}:"
  std::sort(out.begin(), out.end());
  return out;
}

//! type + content of a key, for byte-for-byte comparisons: string bytes, sorted hash fields, sorted set members
std::string dump_key(RedisClient& c, const std::string& key) {
  std::string type = c.command(RedisCommand{"TYPE", key}).str;
  if (type == "string") return "string:" + c.command(RedisCommand{"GET", key}).str;
  if (type == "hash") {
    RedisReply r = c.command(RedisCommand{"HGETALL", key});
    std::map<std::string, std::string> f;
    for (size_t i = 0; i + 1 < r.elements.size(); i += 2) f[r.elements[i].str] = r.elements[i + 1].str;
    std::string s = "hash:";
    for (auto& kv : f) s += kv.first + "=" + kv.second + ";";
    return s;
  }
  if (type == "set") {
    RedisReply r = c.command(RedisCommand{"SMEMBERS", key});
    std::set<std::string> m;
    for (auto& e : r.elements) m.insert(e.str);
    std::string s = "set:";
    for (auto& x : m) s += x + ";";
    return s;
  }
  return type;
}

//! every key of store (prefix, a) equals the one of (prefix, b): names (modulo td_id), types, bytes
void compare_layout(RedisClient& ca, const std::string& pa, const std::string& a, RedisClient& cb,
                    const std::string& pb, const std::string& b) {
  std::vector<std::string> ka = keys_of(ca, pa, a), kb = keys_of(cb, pb, b);
  BOOST_TEST(ka == kb, "key names differ");
  BOOST_TEST(!ka.empty());
  for (const auto& k : ka) {
    std::string va = dump_key(ca, redis_key(pa, a, k)), vb = dump_key(cb, redis_key(pb, b, k));
    BOOST_TEST(va == vb, "key " << k << " differs");
  }
}

std::vector<double> flat_values(const at::Tensor& t) {
  at::Tensor d = t.is_complex() ? at::view_as_real(t).to(at::kDouble) : t.to(at::kDouble);
  d = d.contiguous().reshape({-1});
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

std::vector<double> json_values(const JsonValue& v) {
  std::vector<double> out;
  for (const auto& e : v.as_array()) out.push_back(e.is_bool() ? (e.as_bool() ? 1.0 : 0.0) : e.as_double());
  return out;
}

std::vector<int64_t> json_shape(const JsonValue& v) {
  std::vector<int64_t> out;
  for (const auto& e : v.as_array()) out.push_back(e.as_int());
  return out;
}

const JsonValue& expected_json() {
  static JsonValue v = JsonValue::parse(td_test::read_file(td_test::fixture("redis/python-store.expected.json")));
  return v;
}

const JsonValue& expected_store(const std::string& name) {
  for (const auto& s : expected_json().find("stores")->as_array())
    if (s.find("name")->as_string() == name) return s;
  BOOST_FAIL("no store " << name << " in the fixture");
  throw std::logic_error("unreachable");
}

}  // namespace
#pragma GCC diagnostic pop
