// Storage specs under hostile input (issue 14, "fuzzing storage specs"): a seeded generator mutates the specs of
// four real storages — a memmap directory, a shared-memory TensorDict, an HDF5 file and a Redis store on a real
// redis-server — and hands each result to open_storage, the way a map worker, a store client or a loader worker
// reopens what it was sent. Mutations: bytes of the JSON text flipped, inserted, deleted or cut; the driver
// renamed; fields dropped, swapped between drivers or given other JSON kinds; paths pointing at the wrong kind
// of storage, at a truncated meta.json, at nothing; shared-memory handles bit-flipped, cut or made non-hex; Redis
// ports, ids, databases, passwords and devices changed (hosts always loopback). Every spec must open or fail with
// a typed tensordict::Error, an opened one must read, and afterwards every storage still holds its data and
// nothing was created beside it. Deterministic (fixed seeds); it runs under ASan + UBSan in scripts/test.sh.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>

#include <boost/test/unit_test.hpp>

#include "engine/fixtures.hpp"
#include "redis_server.hpp"
#include "tensordict/tensordict.hpp"

using namespace tensordict;
namespace fs = std::filesystem;
using fixtures::TempDir;

namespace {

struct Outcome {
  int opened = 0, typed = 0;
  std::vector<std::string> untyped;  // "<spec> -> <what()>" of anything that is not a tensordict::Error
};

TensorDict sample(int64_t n) {
  TensorDict td(BatchSize{n});
  td.set("obs", at::arange(n * 3, at::kFloat).view({n, 3}));
  td.set(NestedKey{"next", "reward"}, at::arange(n, at::kLong));
  return td;
}

//! what an opened storage must survive: keys, a whole read of each leaf, an indexed read
void exercise(const TensorDict& td) {
  for (const auto& k : td.keys(KeysOptions().include_nested(true).leaves_only(true))) {
    at::Tensor t = td.get(k);
    if (t.defined() && t.dim() > 0 && t.size(0) > 0) (void)t.sum();
  }
  if (!td.batch_size().empty() && td.batch_size()[0] > 0) (void)td.index({0}).to_tensordict();
}

class Mutator {
  static constexpr const char* kBadBytes = "@bad-bytes@";

 public:
  Mutator(uint64_t seed, std::vector<JsonValue> valid, std::vector<std::string> paths)
      : rng_(seed), valid_(std::move(valid)), paths_(std::move(paths)) {}

  std::string next() {
    JsonValue spec = valid_[pick(valid_.size())];
    const size_t rounds = 1 + pick(3);
    for (size_t r = 0; r < rounds; ++r) mutate_fields(spec);
    force_loopback(spec);
    std::string text = raw_dump(spec);
    for (size_t at = text.find(kBadBytes); at != std::string::npos; at = text.find(kBadBytes)) {
      text.replace(at, std::string(kBadBytes).size(), "\xff\xfe\\u0000z");
    }
    if (pick(4) == 0) mutate_bytes(text);
    return text;
  }

 private:
  size_t pick(size_t n) { return static_cast<size_t>(rng_() % n); }

  JsonValue random_value() {
    switch (pick(12)) {
      case 0: return JsonValue(nullptr);
      case 1: return JsonValue(pick(2) == 0);
      case 2: return JsonValue(static_cast<long long>(rng_()));
      case 3: return JsonValue(static_cast<int>(pick(70000)) - 2);
      case 4: return JsonValue(1.5e300);
      case 5: return JsonValue::array({JsonValue("a"), JsonValue(1)});
      case 6: return JsonValue::object({{"path", JsonValue(paths_[pick(paths_.size())])}});
      case 7: return JsonValue(std::string(pick(2) ? 5000 : 1, 'x'));
      case 8: return JsonValue(kBadBytes);  // replaced by invalid UTF-8 and an escaped NUL in the text
      case 9: return JsonValue(paths_[pick(paths_.size())]);
      case 10: return JsonValue(std::string("cuda:") + std::to_string(pick(9)));
      default: return JsonValue("");
    }
  }

  void mutate_fields(JsonValue& spec) {
    static const std::vector<std::string> drivers = {"memmap", "shared", "h5", "redis", "", "MEMMAP", "memmap ",
                                                     "hdf5", "redis://", "\xc3\x28", "memory", "lazy"};
    static const std::vector<std::string> fields = {"driver", "path", "handle", "group", "host", "port", "db",
                                                    "td_id", "prefix", "password", "unix_socket", "device"};
    auto& obj = spec.as_object();
    switch (pick(8)) {
      case 0:  // the driver renamed, or given another kind
        set(obj, "driver", pick(4) == 0 ? random_value() : JsonValue(drivers[pick(drivers.size())]));
        break;
      case 1:  // a field dropped
        if (!obj.empty()) obj.erase(obj.begin() + static_cast<long>(pick(obj.size())));
        break;
      case 2:  // a field of any driver set to anything
        set(obj, fields[pick(fields.size())], random_value());
        break;
      case 3:  // a path pointing somewhere else (another kind of storage, a truncated directory, nothing)
        set(obj, "path", JsonValue(paths_[pick(paths_.size())]));
        break;
      case 4:  // the fields of another driver's valid spec, under this driver
        for (const auto& kv : valid_[pick(valid_.size())].as_object()) {
          if (kv.first != "driver") set(obj, kv.first, kv.second);
        }
        break;
      case 5: {  // a shared-memory handle or a Redis id corrupted
        for (const char* f : {"handle", "td_id", "group", "prefix"}) {
          for (auto& kv : obj) {
            if (kv.first == f && kv.second.is_string()) {
              std::string s = kv.second.as_string();
              mutate_bytes(s);
              kv.second = JsonValue(s);
            }
          }
        }
        break;
      }
      case 6:  // numbers of the Redis spec at their edges
        set(obj, pick(2) ? "port" : "db", JsonValue(std::vector<long long>{0, -1, 1, 65535, 65536, 16, 1LL << 40}[pick(7)]));
        break;
      default:  // a duplicated key (the parser's first-or-last choice must not matter for safety)
        if (!obj.empty()) obj.push_back(obj[pick(obj.size())]);
        break;
    }
  }

  void mutate_bytes(std::string& s) {
    const size_t n = 1 + pick(4);
    for (size_t i = 0; i < n && !s.empty(); ++i) {
      const size_t at = pick(s.size());
      switch (pick(5)) {
        case 0: s[at] = static_cast<char>(s[at] ^ (1 << pick(8))); break;
        case 1: s.insert(at, 1, "{}[]\",:\\0aZ\x7f"[pick(13)]); break;
        case 2: s.erase(at, 1 + pick(8)); break;
        case 3: s.resize(at); break;  // truncated
        default: s[at] = static_cast<char>(rng_()); break;
      }
    }
  }

  //! the spec as JSON text, its strings written byte for byte (JsonValue::dump refuses invalid UTF-8, which
  //! is part of what the parser must face)
  static std::string raw_dump(const JsonValue& spec) {
    std::string out = "{";
    for (const auto& kv : spec.as_object()) {
      if (out.size() > 1) out += ", ";
      out += JsonValue(kv.first).dump() + ": ";
      if (!kv.second.is_string()) {
        out += kv.second.dump();
        continue;
      }
      out += '"';
      for (const char c : kv.second.as_string()) {
        if (c == '"' || c == '\\') {
          out += '\\';
          out += c;
        } else if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
      }
      out += '"';
    }
    return out + "}";
  }

  static void set(JsonValue::Object& obj, const std::string& key, JsonValue v) {
    for (auto& kv : obj) {
      if (kv.first == key) {
        kv.second = std::move(v);
        return;
      }
    }
    obj.emplace_back(key, std::move(v));
  }

  //! only loopback: a mutated host is put back to 127.0.0.1 (no name lookups, no other machine)
  static void force_loopback(JsonValue& spec) {
    for (auto& kv : spec.as_object()) {
      if (kv.first == "host" && !(kv.second.is_string() && (kv.second.as_string() == "127.0.0.1" ||
                                                            kv.second.as_string() == "localhost"))) {
        kv.second = JsonValue("127.0.0.1");
      }
      if (kv.first == "unix_socket") kv.second = JsonValue("");
    }
  }

  std::mt19937_64 rng_;
  std::vector<JsonValue> valid_;
  std::vector<std::string> paths_;
};

Outcome hammer(Mutator& m, int n) {
  Outcome o;
  for (int i = 0; i < n; ++i) {
    const std::string text = m.next();
    try {
      const StorageSpec spec = StorageSpec::parse(text);
      TensorDict td = open_storage(spec, OpenOptions().writable(i % 2 == 0));
      exercise(td);
      ++o.opened;
    } catch (const Error&) {
      ++o.typed;
    } catch (const std::exception& e) {
      o.untyped.push_back(text + " -> " + e.what());
    }
  }
  return o;
}

std::set<std::string> listing(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& de : fs::recursive_directory_iterator(dir)) out.insert(fs::relative(de.path(), dir).string());
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(spec_fuzz)

BOOST_AUTO_TEST_CASE(mutated_specs_open_or_fail_typed_and_harm_nothing) {
  TempDir dir("spec-fuzz");
  const TensorDict ref = sample(6);
  // the four storages
  TensorDict mm = ref.clone();
  mm.memmap_(dir / "mm");
  TensorDict sh = ref.clone();
  sh.share_memory_();
  PersistentTensorDict h5 = PersistentTensorDict::from_dict(ref, dir / "data.h5");
  h5.close();
  testutil::RedisServer server;
  TensorDictStore rs = TensorDictStore::from_tensordict(ref, RedisOptions().port(server.port()));
  // wrong and broken places: a truncated meta.json, a non-h5 file, a directory of nothing, no such path
  fs::create_directories(dir / "truncated");
  fs::copy(dir / "mm", dir / "truncated", fs::copy_options::recursive);
  {
    std::ifstream in(dir / "mm/meta.json");
    std::string meta((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(dir / "truncated/meta.json", std::ios::trunc) << meta.substr(0, meta.size() / 2);
  }
  std::ofstream(dir / "not.h5") << "not an HDF5 file";
  fs::create_directories(dir / "empty");
  const std::vector<std::string> paths = {
      dir / "mm", dir / "data.h5", dir / "truncated", dir / "not.h5", dir / "empty", dir / "nothing",
      dir / "mm/obs.memmap", dir / "mm/meta.json", dir / "mm/next", "", "/", ".", "..", "/proc/self",
      "/dev/null", std::string(5000, '/')};
  const std::set<std::string> before = listing(dir.path);

  std::vector<JsonValue> valid;
  for (const TensorDict& td : {mm, sh, TensorDict(PersistentTensorDict::from_h5(dir / "data.h5")), TensorDict(rs)}) {
    valid.push_back(JsonValue::parse(StorageSpec::of(td).dump()));
  }
  valid.push_back(JsonValue::parse(StorageSpec::of(mm.get_td("next")).dump()));
  // every valid spec opens and reads back the data
  for (const auto& v : valid) {
    const TensorDict back = open_storage(StorageSpec::parse(v.dump()), OpenOptions().writable(false)).to_tensordict();
    if (back.contains("obs")) {
      BOOST_TEST(back.get("obs").equal(ref.get("obs")), v.dump());
    } else {  // the spec of the nested "next"
      BOOST_TEST(back.get("reward").equal(ref.get(NestedKey{"next", "reward"})), v.dump());
    }
  }

  Mutator m(20261125, valid, paths);
  const Outcome o = hammer(m, 3000);
  BOOST_TEST_MESSAGE("storage specs: " << o.opened << " opened, " << o.typed << " typed errors, "
                                       << o.untyped.size() << " other");
  BOOST_TEST(o.untyped.empty(), (o.untyped.empty() ? "" : o.untyped.front()));
  BOOST_TEST(o.opened > 0);
  BOOST_TEST(o.typed > 0);

  // every storage still holds its data; nothing was created or removed beside them
  BOOST_TEST(TensorDict::load_memmap(dir / "mm").to_tensordict().get("obs").equal(ref.get("obs")));
  BOOST_TEST(sh.get("obs").equal(ref.get("obs")));
  BOOST_TEST(PersistentTensorDict::from_h5(dir / "data.h5").to_tensordict().get("obs").equal(ref.get("obs")));
  BOOST_TEST(TensorDictStore::from_store(rs.td_id(), RedisOptions().port(server.port()))
                 .to_tensordict()
                 .get(NestedKey{"next", "reward"})
                 .equal(ref.get(NestedKey{"next", "reward"})));
  BOOST_TEST(listing(dir.path) == before);
}

BOOST_AUTO_TEST_CASE(a_device_this_process_cannot_use_is_a_value_error_where_it_is_named) {
  TempDir dir("spec-device");
  auto message_of = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const ValueError& e) {
      return e.what();
    } catch (const std::exception& e) {
      return std::string("not a ValueError: ") + e.what();
    }
    return "no error";
  };
  // in a spec: refused before any connection (port 1 is closed; the device is checked first)
  std::string m = message_of([] {
    open_storage(StorageSpec::parse(R"({"driver": "redis", "host": "127.0.0.1", "port": 1, "device": "cuda:2"})"));
  });
  BOOST_TEST(m.find("device 'cuda:2' is not available") != std::string::npos, m);
  m = message_of([] {
    open_storage(StorageSpec::parse(R"({"driver": "redis", "host": "127.0.0.1", "port": 1, "device": "gpu-ish"})"));
  });
  BOOST_TEST(m.find("'gpu-ish' is not a device") != std::string::npos, m);
  // in options: an HDF5 buffer on a device this process cannot use is refused before the file is created
  const Schema schema = {{NestedKey("x"), {{3}, at::kFloat}}};
  m = message_of([&] {
    TensorDict::from_schema(schema, {4}, "h5", H5Options().filename(dir / "buf.h5").device(at::Device("cuda:1")));
  });
  BOOST_TEST(m.find("device 'cuda:1' is not available") != std::string::npos, m);
  BOOST_TEST(!fs::exists(dir / "buf.h5"));
  // the CPU is always fine
  TensorDict ok = TensorDict::from_schema(schema, {4}, "h5", H5Options().filename(dir / "ok.h5").device(at::Device("cpu")));
  BOOST_TEST(ok.get("x").device().is_cpu());
}

BOOST_AUTO_TEST_CASE(credentials_in_urls_and_specs_never_appear_in_an_error) {
  // a password-protected server; every password tried holds the marker "S3cr", so no message may hold it
  const std::string secret = "Fz-S3cr-et-91c2";
  testutil::RedisServer server(testutil::RedisServerOptions{"", secret, false});
  const std::string port = std::to_string(server.port());
  TensorDictStore rs = TensorDictStore::from_tensordict(sample(6), RedisOptions().port(server.port()).password(secret));
  const std::string spec_text = StorageSpec::of(rs).dump();
  BOOST_TEST(spec_text.find("S3cr") == std::string::npos, spec_text);
  BOOST_TEST(rs.address().find("S3cr") == std::string::npos);
  std::mt19937_64 rng(20261126);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  const std::vector<std::string> passwords = {secret, secret + "x", "wrong-S3cr-1", "S3cr", "S3cr%zz", "S3cr%40x",
                                              "S3cr@at", "S3cr/slash", "S3cr%3Fq", "S3cr&amp"};
  std::vector<std::string> messages;
  int opened = 0, untyped = 0;
  auto attempt = [&](const std::function<void()>& f) {
    try {
      f();
      ++opened;
    } catch (const Error& e) {
      messages.push_back(e.what());
    } catch (const std::exception& e) {
      ++untyped;
      messages.push_back(e.what());
    }
  };
  for (int i = 0; i < 400; ++i) {
    const std::string pw = passwords[pick(passwords.size())];
    const std::string user = std::vector<std::string>{"", "default", "nobody"}[pick(3)];
    // a URL from parts: credentials where they go and where they do not
    const std::string auth = std::vector<std::string>{"", ":" + pw + "@", user + ":" + pw + "@", pw + "@",
                                                      ":" + pw + ":x@"}[pick(5)];
    const std::string p = std::vector<std::string>{port, port, "1", "99999", "x", ""}[pick(6)];
    const std::string db = std::vector<std::string>{"0", "0", "1", "x", "-1", ""}[pick(6)];
    const std::string q = std::vector<std::string>{"td_id=" + rs.td_id(), "td_id=" + rs.td_id() + "&password=" + pw,
                                                   "password=" + pw + "&timeout=x", "bogus=1&password=" + pw,
                                                   "td_id=nope&password=" + pw, "timeout=3&user=" + user}[pick(6)];
    const std::string url = "redis://" + auth + "127.0.0.1" + (p.empty() ? "" : ":" + p) + (db.empty() ? "" : "/" + db) + "?" + q;
    attempt([&] {
      RedisOptions o = RedisOptions::from_url(url);
      TensorDictStore::from_store(o.td_id().empty() ? "missing" : o.td_id(), o.retries(1).connect_timeout_ms(500)).to_tensordict();
    });
    // a spec carrying credentials (other processes never get them this way, but a hand-written spec may)
    JsonValue spec = JsonValue::parse(spec_text);
    auto& obj = spec.as_object();
    obj.emplace_back("password", JsonValue(pw));
    if (pick(2)) obj.emplace_back("user", JsonValue(user));
    if (pick(3) == 0) obj.emplace_back("port", JsonValue(pick(2) ? 1 : 70000));
    attempt([&] { open_storage(StorageSpec::parse(spec.dump())).to_tensordict(); });
  }
  BOOST_TEST_MESSAGE("credentials: " << opened << " opened, " << messages.size() << " errors");
  BOOST_TEST(untyped == 0);
  BOOST_TEST(opened > 0);
  BOOST_TEST(messages.size() > 100u);
  for (const auto& m : messages) BOOST_TEST(m.find("S3cr") == std::string::npos, m);
}

BOOST_AUTO_TEST_SUITE_END()
