// The Redis LeafStore: ACL users and credentials from the environment (no secret in any message), timeouts of a
// server that never answers, long replies, junk metadata fields. Helpers in test_redis_store_util.hpp.
#include "backends/test_redis_store_util.hpp"

BOOST_AUTO_TEST_SUITE(redis_store_secrets)

namespace {

//! a TCP listener on 127.0.0.1 that accepts connections and never answers (a hung server); counts accepts. With a
//! `reply`, it answers each connection's first request with those bytes instead (a server speaking garbage), and
//! keeps the connection open
class SilentListener {
 public:
  explicit SilentListener(std::string reply = "") : reply_(std::move(reply)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    BOOST_REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    BOOST_REQUIRE(::listen(fd_, 16) == 0);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      while (!stop_ && std::chrono::steady_clock::now() < deadline) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 20) == 1) {
          const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
          if (c >= 0) {
            held_.push_back(c);
            ++accepted_;
            pollfd q{c, POLLIN, 0};
            char request[4096];
            if (!reply_.empty() && ::poll(&q, 1, 2000) == 1 && ::read(c, request, sizeof request) > 0)
              (void)!::write(c, reply_.data(), reply_.size());
          }
        }
      }
    });
  }
  ~SilentListener() {
    stop_ = true;
    thread_.join();
    for (int c : held_) ::close(c);
    ::close(fd_);
  }
  int port() const { return port_; }
  int accepted() const { return accepted_.load(); }

 private:
  std::string reply_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::vector<int> held_;
  std::thread thread_;
};

//! a TCP proxy on 127.0.0.1 to a Redis server that hands the server's replies on slowly: `chunk` bytes, then a
//! pause of `pause_ms`. A long reply then takes far longer than a reply timeout while bytes keep arriving.
class SlowProxy {
 public:
  SlowProxy(int target_port, size_t chunk, int pause_ms) : target_(target_port), chunk_(chunk), pause_ms_(pause_ms) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    BOOST_REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    BOOST_REQUIRE(::listen(fd_, 4) == 0);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~SlowProxy() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }

 private:
  void run() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    int client = -1;
    while (!stop_ && client < 0 && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) == 1) client = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    }
    if (client < 0) return;
    const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(target_));
    if (::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(client);
      ::close(server);
      return;
    }
    std::vector<char> buf(chunk_);
    while (!stop_ && std::chrono::steady_clock::now() < deadline) {
      pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (::poll(p, 2, 20) <= 0) continue;
      if (p[0].revents) {  // requests: on at once
        const ssize_t n = ::recv(client, buf.data(), buf.size(), 0);
        if (n <= 0 || ::send(server, buf.data(), static_cast<size_t>(n), MSG_NOSIGNAL) != n) break;
      }
      if (p[1].revents) {  // replies: one chunk, then a pause
        const ssize_t n = ::recv(server, buf.data(), buf.size(), 0);
        if (n <= 0 || ::send(client, buf.data(), static_cast<size_t>(n), MSG_NOSIGNAL) != n) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms_));
      }
    }
    ::close(client);
    ::close(server);
  }

  int fd_ = -1;
  int port_ = 0;
  int target_;
  size_t chunk_;
  int pause_ms_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

//! sets an environment variable for the scope (the Redis tests run on one thread)
struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) { ::setenv(name.c_str(), value.c_str(), 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

}  // namespace

BOOST_AUTO_TEST_CASE(acl_users_environment_credentials_and_no_secret_in_messages) {
  const std::string pw = "Pw-s3cret-7f1d", alice_pw = "Alice-s3cret-99";
  testutil::RedisServer secured(testutil::RedisServerOptions{"", pw, false});
  RedisClient admin(RedisOptions(opts(secured)).password(pw).connect_options());
  admin.command(RedisCommand{"ACL", "SETUSER", "alice", "on", ">" + alice_pw, "~*", "&*", "+@all"});
  // an ACL user: AUTH user password
  auto a = create_redis_store(RedisOptions(opts(secured)).user("alice").password(alice_pw), {3});
  BOOST_TEST(*a->stored_batch_size() == std::vector<int64_t>{3});
  BOOST_TEST(!contains(a->describe(), alice_pw));
  BOOST_TEST(!contains(a->spec_fields().dump(), alice_pw));
  BOOST_TEST(!contains(a->spec_fields().dump(), "alice"));
  // wrong passwords: a clear error without the secret (nor the right one)
  for (const std::string& wrong : {std::string("Wrong-s3cret-1"), pw + "x"}) {
    std::string m = message_of<BackendError>(
        [&] { create_redis_store(RedisOptions(opts(secured)).user("alice").password(wrong), {1}); });
    BOOST_TEST(contains(m, "authentication failed"));
    BOOST_TEST(contains(m, "127.0.0.1:" + std::to_string(secured.port())));
    BOOST_TEST(!contains(m, wrong));
    BOOST_TEST(!contains(m, pw));
  }
  std::string m = message_of<BackendError>([&] { create_redis_store(opts(secured), {1}); });
  BOOST_TEST(contains(m, "TENSORDICT_REDIS_PASSWORD"));
  // the environment, when no password is given: the general variables, then the endpoint's own
  {
    ScopedEnv u("TENSORDICT_REDIS_USER", "alice");
    ScopedEnv p("TENSORDICT_REDIS_PASSWORD", alice_pw);
    BOOST_TEST(open_redis_store(a->spec_fields())->stored_batch_size().has_value());
    BOOST_TEST(open_redis_store(RedisOptions(opts(secured)).td_id(redis_store_td_id(*a)))->stored_batch_size().has_value());
  }
  {
    const std::string endpoint = "127.0.0.1:" + std::to_string(secured.port());
    BOOST_TEST(redis_password_env_name(endpoint) == "TENSORDICT_REDIS_PASSWORD_127_0_0_1_" + std::to_string(secured.port()));
    ScopedEnv p(redis_password_env_name(endpoint), pw);
    ScopedEnv wrong("TENSORDICT_REDIS_PASSWORD", "not-this-one");
    BOOST_TEST(open_redis_store(a->spec_fields())->stored_batch_size().has_value());
  }
  // what this process authenticated with is handed to its worker processes through their environment
  bool found = false;
  for (const auto& e : redis_child_environment())
    found = found || e == redis_password_env_name("127.0.0.1:" + std::to_string(secured.port())) + "=" + pw;
  BOOST_TEST(found);
  // URLs in messages
  BOOST_TEST(redact_redis_url("redis://alice:" + alice_pw + "@127.0.0.1:6379/0?td_id=x") ==
             "redis://alice:***@127.0.0.1:6379/0?td_id=x");
  BOOST_TEST(redact_redis_url("redis://:" + pw + "@h/1") == "redis://:***@h/1");
  BOOST_TEST(redact_redis_url("redis://" + pw + "@h") == "redis://***@h");
  BOOST_TEST(redact_redis_url("redis://h:1/0?prefix=p&password=" + pw + "&td_id=i") ==
             "redis://h:1/0?prefix=p&password=***&td_id=i");
  BOOST_TEST(redact_redis_url("redis://:a/b?c@h:1/0") == "redis://:***@h:1/0");  // unencoded '/' and '?'
  BOOST_TEST(redact_redis_url("redis://h:1/0?prefix=p") == "redis://h:1/0?prefix=p");
  BOOST_TEST(redact_redis_url("redis://a@b@h:1/0?password=a@b") == "redis://***@b");  // never less than the secret
  BOOST_TEST(redact_secret("AUTH " + pw + " failed " + pw, pw) == "AUTH *** failed ***");
}

BOOST_AUTO_TEST_CASE(a_server_that_never_answers_is_a_timeout_error_once) {
  SilentListener silent;
  const std::string where = "127.0.0.1:" + std::to_string(silent.port());
  std::string m = message_of<BackendError>(
      [&] { create_redis_store(RedisOptions().port(silent.port()).command_timeout_ms(300).retries(3), {1}); });
  BOOST_TEST(contains(m, "no reply from " + where + " within 0.3 s"), m);
  BOOST_TEST(!contains(m, "Resource temporarily unavailable"), m);
  BOOST_TEST(silent.accepted() == 1);  // not retried: a silent server would multiply the wait
  m = message_of<BackendError>([&] { RedisClient c(RedisOptions().port(silent.port()).command_timeout_ms(1000).connect_options()); });
  BOOST_TEST(contains(m, "no reply from " + where + " within 1 s"), m);
}

BOOST_AUTO_TEST_CASE(a_server_speaking_garbage_is_a_protocol_error) {
  // the replies are parsed by the client itself (RESP2): a malformed one is a BackendError naming the fault, never
  // a crash, a hang or a huge allocation
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"?what\r\n", "a reply starting with byte 63"},
      {":12x\r\n", "'12x' is not a length or an integer"},
      {"$3\r\nabcdef\r\n", "a bulk string longer than its length"},
      {"+PONG\rX", "a reply line without its \\r\\n"},
      {"*99999999999999\r\n", "no reply from"},  // a huge array announced: waits for elements, then times out
      {"\r\n", "an empty reply line"}};
  for (const auto& [bytes, expect] : cases) {
    BOOST_TEST_CONTEXT("reply " << bytes) {
      SilentListener garbage(bytes);
      const std::string m = message_of<BackendError>(
          [&] { RedisClient c(RedisOptions().port(garbage.port()).command_timeout_ms(300).connect_options()); });
      BOOST_TEST(contains(m, expect), m);
    }
  }
  // a write transaction's replies, checked in the buffer (transaction_errors): the handshake's PONG, then MULTI's
  // +OK, one +QUEUED and a malformed EXEC
  const std::vector<std::pair<std::string, std::string>> tx_cases = {
      {"*1\r\n:12x\r\n", "':12x' is not an integer reply"},
      {"*1\r\n:\r\n", "':' is not an integer reply"},
      {"*1x\r\n", "'*1x' is not an array length"},
      {"*-1\r\n", "unexpected EXEC reply"},
      {"*2\r\n:1\r\n:1\r\n", "unexpected EXEC reply"}};
  for (const auto& [exec, expect] : tx_cases) {
    BOOST_TEST_CONTEXT("EXEC reply " << exec) {
      SilentListener garbage("+PONG\r\n+OK\r\n+QUEUED\r\n" + exec);
      RedisClient c(RedisOptions().port(garbage.port()).command_timeout_ms(300).connect_options());
      const std::string m = message_of<BackendError>([&] { c.transaction_errors({RedisCommand{"SETRANGE", "k", "0", "v"}}); });
      BOOST_TEST(contains(m, expect), m);
    }
  }
  // a reply that stops halfway (the server stays connected): the reply timeout, never a short string
  SilentListener cut("$10\r\nabc");
  const std::string m = message_of<BackendError>(
      [&] { RedisClient c(RedisOptions().port(cut.port()).command_timeout_ms(300).connect_options()); });
  BOOST_TEST(contains(m, "no reply from"), m);
}

BOOST_AUTO_TEST_CASE(a_long_reply_that_keeps_arriving_is_not_cut) {
  auto s = new_store({1});
  // 4 MiB handed on 64 KiB every 80 ms: over 5 s in all, never 2 s without a byte (a 1 s timeout once expired
  // on a machine busy compiling: the proxy's thread or the server did not run for a second)
  const int64_t n = int64_t{4} << 20;
  s->client().command(RedisCommand{"SETRANGE", s->key("slow"), std::to_string(n - 1), "z"});
  SlowProxy proxy(shared_server().port(), 64 * 1024, 80);
  RedisClient slow(RedisOptions().port(proxy.port()).command_timeout_ms(2000).retries(1).connect_options());
  const auto t0 = std::chrono::steady_clock::now();
  RedisReply r = slow.command(RedisCommand{"GET", s->key("slow")});
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST_MESSAGE("4 MiB through the slow proxy: " << secs << " s with a 2 s reply timeout");
  BOOST_TEST(secs > 2.0);  // longer than the timeout in all: the timeout counts from the last byte
  BOOST_TEST(r.str.size() == static_cast<size_t>(n));
  BOOST_TEST(r.str.back() == 'z');
  // a 200 MB leaf with a 2 s timeout, straight from the server
  auto big = std::dynamic_pointer_cast<RedisStore>(
      create_redis_store(RedisOptions(opts(shared_server())).command_timeout_ms(2000), {200 * 1000 * 1000}));
  big->create({"b"}, at::kByte, {200 * 1000 * 1000}, at::Tensor(), {});
  big->client().command(RedisCommand{"SETRANGE", big->key("d:b"), "199999999", "\x07"});
  at::Tensor t = big->read({LeafRead{{"b"}, true, {}}})[0];
  BOOST_TEST(t.numel() == 200 * 1000 * 1000);
  BOOST_TEST(t[199999999].item<int>() == 7);
  big->erase({"b"});
}

BOOST_AUTO_TEST_CASE(a_junk_device_field_is_a_format_error_naming_store_and_field) {
  auto s = new_store({2});
  const std::string id = s->td_id();
  for (const std::string& ok : {std::string(""), std::string("cpu"), std::string("cuda:0")}) {
    s->client().command(RedisCommand{"SET", s->key("__device__"), ok});
    BOOST_CHECK_NO_THROW(open_redis_store(RedisOptions(opts(shared_server())).td_id(id)));
  }
  for (const std::string& junk : {std::string("\x01junk\x1b[31m"), std::string("gpu:0"), std::string(" cpu"),
                                  std::string("cuda:-1"), std::string(5000, 'x')}) {
    s->client().command(RedisCommand{"SET", s->key("__device__"), junk});
    std::string m = message_of<FormatError>([&] { open_redis_store(RedisOptions(opts(shared_server())).td_id(id)); });
    BOOST_TEST(contains(m, "__device__"), m);
    BOOST_TEST(contains(m, id), m);
    BOOST_TEST(!contains(m, "\x1b"), m);
  }
}

BOOST_AUTO_TEST_SUITE_END()
