#pragma once
//! RedisClient: one blocking connection to a Redis (or Redis-compatible) server over hiredis 0.14.
//! - connect over TCP (host/port) or a unix socket, AUTH with a password, SELECT a db, with a connect timeout
//!   and a command timeout (a reply that does not come in time drops the connection);
//! - command(argv), pipeline(commands) (all commands appended, then all replies read: ONE round trip) and
//!   transaction(commands) (MULTI ... EXEC in one pipeline);
//! - replies are owned, binary-safe values (RedisReply); no hiredis type appears in this header.
//! Errors: refused connection, unknown host, authentication failure, a server gone or a timeout →
//! BackendError naming the endpoint ("127.0.0.1:6379" or the socket path). After a lost connection the
//! request in flight fails (its effect on the server is unknown: it is never reported as done) and the NEXT
//! call reconnects (`retries` attempts, `retry_delay_ms` apart, then BackendError).
//! Not thread-safe: one client per thread / actor.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <string>
#include <vector>

struct redisContext;

namespace tensordict {
namespace backends {

//! an owned reply: Nil, Status ("OK"), Error (Redis's text), Integer, String (binary-safe) or Array
struct RedisReply {
  enum class Type { Nil, Status, Error, Integer, String, Array };
  Type type = Type::Nil;
  std::string str;  //!< String / Status / Error text
  int64_t integer = 0;
  std::vector<RedisReply> elements;

  bool is_nil() const { return type == Type::Nil; }
  bool is_error() const { return type == Type::Error; }
  bool is_string() const { return type == Type::String; }
  bool is_array() const { return type == Type::Array; }
  bool is_integer() const { return type == Type::Integer; }
};

//! one command's arguments. Arguments are copied (arg) or borrowed (arg_view: the bytes must stay alive and
//! unchanged until the call that sends the command returns; used for tensor payloads, which are not copied).
class RedisCommand {
 public:
  RedisCommand() = default;
  RedisCommand(std::initializer_list<std::string> args) {
    for (const auto& a : args) arg(a);
  }
  RedisCommand(const std::vector<std::string>& args) {  // NOLINT: implicit on purpose
    for (const auto& a : args) arg(a);
  }
  RedisCommand(const RedisCommand& o) { *this = o; }
  RedisCommand& operator=(const RedisCommand& o);
  RedisCommand(RedisCommand&&) = default;
  RedisCommand& operator=(RedisCommand&&) = default;

  RedisCommand& arg(std::string s) {
    owned_.push_back(std::move(s));
    ptrs_.push_back(owned_.back().data());
    lens_.push_back(owned_.back().size());
    owned_index_.push_back(static_cast<int64_t>(owned_.size()) - 1);
    return *this;
  }
  RedisCommand& arg(int64_t v) { return arg(std::to_string(v)); }
  RedisCommand& arg_view(const void* data, size_t size) {
    ptrs_.push_back(static_cast<const char*>(data));
    lens_.push_back(size);
    owned_index_.push_back(-1);
    return *this;
  }
  size_t size() const { return ptrs_.size(); }
  const char* const* argv() const { return ptrs_.data(); }
  const size_t* argvlen() const { return lens_.data(); }
  //! argument i as a string (a copy), for messages
  std::string at(size_t i) const { return std::string(ptrs_[i], lens_[i]); }

 private:
  std::deque<std::string> owned_;  // stable addresses
  std::vector<const char*> ptrs_;
  std::vector<size_t> lens_;
  std::vector<int64_t> owned_index_;  // index into owned_, -1 for a borrowed view
};

struct RedisConnectOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string unix_socket;  //!< non-empty: connect to this socket instead of host:port
  int db = 0;
  std::string password;        //!< non-empty: AUTH on every (re)connect
  int connect_timeout_ms = 2000;
  int command_timeout_ms = 30000;  //!< 0: none
  int retries = 3;                 //!< connection attempts of a (re)connect
  int retry_delay_ms = 100;        //!< between attempts
};

class RedisClient {
 public:
  //! connects at once (BackendError when it cannot)
  explicit RedisClient(RedisConnectOptions options);
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  //! one command; an error reply throws (redis_reply_error: BackendError with Redis's text, ValueError for
  //! arguments Redis refuses as too large / out of range)
  RedisReply command(const RedisCommand& cmd);
  //! all commands in one round trip; replies in order, error replies returned as values (not thrown)
  std::vector<RedisReply> pipeline(const std::vector<RedisCommand>& cmds);
  //! MULTI, the commands, EXEC in one round trip: the commands' replies (runtime error replies as values).
  //! A command refused while queueing (EXECABORT: nothing was applied) throws.
  std::vector<RedisReply> transaction(const std::vector<RedisCommand>& cmds);

  //! "host:port" or the unix socket path
  std::string endpoint() const;
  const RedisConnectOptions& options() const { return options_; }
  bool connected() const { return ctx_ != nullptr; }
  //! closes the connection (the next call reconnects)
  void disconnect();
  //! how many connections were made (1 after construction; +1 per reconnect)
  int64_t connections() const { return connections_; }

 private:
  void ensure_connected();
  void connect_once();
  [[noreturn]] void lost(const std::string& what, const std::string& reason = "");
  std::vector<RedisReply> roundtrip(const std::vector<const RedisCommand*>& cmds);

  RedisConnectOptions options_;
  redisContext* ctx_ = nullptr;
  int64_t connections_ = 0;
};

//! throws the error of an error reply: ValueError when the caller's arguments are at fault (too large
//! a value, offset out of range), else BackendError; `context` prefixes Redis's text
[[noreturn]] void redis_reply_error(const RedisReply& reply, const std::string& context);

}  // namespace backends
}  // namespace tensordict
