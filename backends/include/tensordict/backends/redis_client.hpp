#pragma once
//! RedisClient: one blocking connection to a Redis (or Redis-compatible) server over hiredis 0.14.
//! - connect over TCP (host/port) or a unix socket, AUTH with a password (and an ACL user), SELECT a db, with a
//!   connect timeout and a reply timeout: "no byte received within T" (hiredis' timeout is per read() call, so a
//!   long reply that keeps arriving is never cut); a server that stays silent for T is a BackendError "no reply
//!   from HOST:PORT within T s", raised once (never retried: a silent server would multiply the wait);
//! - credentials: given, else from the environment (redis_env_credentials); never part of a message: every
//!   text this layer builds goes through redact_secret, and URLs through redact_redis_url;
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
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
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
    reserve(args.size());
    for (const auto& a : args) arg(a);
  }
  RedisCommand(const std::vector<std::string>& args) {  // NOLINT: implicit on purpose
    reserve(args.size());
    for (const auto& a : args) arg(a);
  }
  // copies and moves keep borrowed views as views; moves are noexcept (a vector of commands grows cheaply)
  RedisCommand(const RedisCommand&) = default;
  RedisCommand& operator=(const RedisCommand&) = default;
  RedisCommand(RedisCommand&&) noexcept = default;
  RedisCommand& operator=(RedisCommand&&) noexcept = default;

  void reserve(size_t n) { args_.reserve(n); }
  //! an argument the command owns (a copy)
  RedisCommand& arg(const std::string& s) { return arg_copy(s.data(), s.size()); }
  RedisCommand& arg(const char* s) { return arg_copy(s, std::char_traits<char>::length(s)); }
  RedisCommand& arg_copy(const char* data, size_t size) {
    args_.push_back(Arg{nullptr, arena_.size(), size});
    arena_.append(data, size);
    return *this;
  }
  RedisCommand& arg(int64_t v);
  //! an argument the command only points to: `data` must outlive the command's use
  RedisCommand& arg_view(const void* data, size_t size) {
    args_.push_back(Arg{static_cast<const char*>(data), 0, size});
    return *this;
  }
  size_t size() const { return args_.size(); }
  //! the command in the Redis protocol (RESP: "*<n>\r\n" then "$<len>\r\n<bytes>\r\n" per argument): its size,
  //! and the bytes written at `p` (resp_size() of them; returns the end). What hiredis's redisAppendCommandArgv
  //! makes, without its sds formatting (15% of a write-behind fill)
  size_t resp_size() const;
  char* write_resp(char* p) const;
  //! argument i as a string (a copy), for messages
  std::string at(size_t i) const {
    const Arg& a = args_[i];
    return a.view ? std::string(a.view, a.len) : arena_.substr(a.off, a.len);
  }

 private:
  struct Arg {
    const char* view;  //!< borrowed bytes, or nullptr: owned, at arena_[off]
    size_t off, len;
  };
  //! the arguments: up to 4 in place (a SETRANGE's four: no allocation per command), more in a vector
  class Args {
   public:
    void reserve(size_t n) {
      if (n > kInline) heap_.reserve(n);
    }
    void push_back(const Arg& a) {
      if (n_ < kInline && heap_.empty()) {
        inline_[n_++] = a;
        return;
      }
      if (heap_.empty()) heap_.assign(inline_, inline_ + n_);
      heap_.push_back(a);
      ++n_;
    }
    size_t size() const { return n_; }
    const Arg* begin() const { return heap_.empty() ? inline_ : heap_.data(); }
    const Arg* end() const { return begin() + n_; }
    const Arg& operator[](size_t i) const { return begin()[i]; }

   private:
    static constexpr size_t kInline = 4;
    Arg inline_[kInline]{};
    std::vector<Arg> heap_;
    size_t n_ = 0;
  };
  std::string arena_;  //!< owned arguments back to back (offsets survive reallocation and moves)
  Args args_;
};

struct RedisConnectOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string unix_socket;  //!< non-empty: connect to this socket instead of host:port
  int db = 0;
  std::string user;            //!< an ACL user (AUTH user password); empty: the default user
  std::string password;        //!< non-empty: AUTH on every (re)connect; empty: redis_env_credentials()
  int connect_timeout_ms = 2000;
  int command_timeout_ms = 5000;  //!< no byte received for this long: BackendError "no reply ..."; 0: none
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
  //! reads that must see one moment (the leaves of a row): transaction(), or a pipeline when the server is over its
  //! maxmemory, where it refuses every command queued in a MULTI (reads too) and every write that could land
  //! between the reads (SET, SETRANGE, HSET: refused when out of memory)
  std::vector<RedisReply> read_together(const std::vector<RedisCommand>& cmds);
  //! transaction() for commands whose replies only matter when they are errors (writes): the error replies
  //! with the index of their command, none when every command succeeded. The other replies are parsed and
  //! checked, not kept (a merged write of 256 rows had 2,000 replies built into two vectors, then dropped)
  std::vector<std::pair<size_t, RedisReply>> transaction_errors(const std::vector<RedisCommand>& cmds);

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
  [[noreturn]] void silent(const std::string& what);
  std::vector<RedisReply> roundtrip(const std::vector<const RedisCommand*>& cmds);
  //! writes the commands to the server (all of them, or throws through lost())
  void send_all(const std::vector<const RedisCommand*>& cmds);
  //! MULTI, cmds, EXEC in ptrs_ (reused)
  const std::vector<const RedisCommand*>& transaction_of(const std::vector<RedisCommand>& cmds);
  //! throws what a transaction's MULTI or EXEC reply says went wrong (`queued(i)`: the reply to cmds[i] while
  //! queueing, for EXECABORT's first refusal); nothing when EXEC's reply is an array of one reply per command
  //! (`replies`: its length)
  template <class Queued>
  void check_transaction(const RedisReply& multi, const RedisReply& exec, size_t replies,
                         const std::vector<RedisCommand>& cmds, Queued&& queued);  // the replies, read and parsed here (RESP2) rather than by hiredis's reader, whose reply objects (a calloc per
  // reply, freed after the copy into RedisReply) were a third of a write-behind fill's store actor
  void read_reply(RedisReply& out, const RedisCommand* cmd, int depth);
  std::string_view read_line(const RedisCommand* cmd);
  //! the hot replies of a write transaction, parsed in the buffer without a RedisReply: skips the next reply
  //! when it is the status `line` and all of it is received (false, nothing read, otherwise); skips an
  //! integer reply (false, nothing read, when the next reply is another type); reads an array's header and
  //! gives its length (-1, nothing read, when the next reply is not an array)
  bool skip_line(std::string_view line);
  bool skip_integer(const RedisCommand* cmd);
  int64_t array_header(const RedisCommand* cmd);
  void read_more(const RedisCommand* cmd);
  //! one recv(2) of up to n bytes (> 0); a timeout, a closed connection or an error throws (silent / lost)
  size_t recv_some(char* to, size_t n, const RedisCommand* cmd);

  RedisConnectOptions options_;
  redisContext* ctx_ = nullptr;
  //! the protocol bytes of a round trip's commands, reused by every round trip (not a string: resizing one
  //! zero-fills what is written over at once)
  std::unique_ptr<char[]> wbuf_;
  size_t wcap_ = 0;
  std::vector<const RedisCommand*> ptrs_;  //!< a transaction's commands (transaction_of)
  std::vector<char> rbuf_;  //!< bytes received and not yet parsed: [rpos_, rend_)
  size_t rpos_ = 0, rend_ = 0;
  int64_t connections_ = 0;
};

//! credentials of a Redis endpoint ("host:port" or the socket path) from the environment: the variables of that
//! endpoint (TENSORDICT_REDIS_PASSWORD_<ENDPOINT>, TENSORDICT_REDIS_USER_<ENDPOINT>, every character of the
//! endpoint other than a letter or digit written '_': TENSORDICT_REDIS_PASSWORD_127_0_0_1_6379), else
//! TENSORDICT_REDIS_PASSWORD / TENSORDICT_REDIS_USER. Empty fields when none is set.
struct RedisCredentials {
  std::string user;
  std::string password;
};
RedisCredentials redis_env_credentials(const std::string& endpoint);
//! the environment variable names of an endpoint's credentials (see redis_env_credentials)
std::string redis_password_env_name(const std::string& endpoint);
std::string redis_user_env_name(const std::string& endpoint);
//! "NAME=value" entries that give a worker process this process's Redis credentials: for every endpoint this
//! process authenticated to, its per-endpoint variables. A process that starts workers (td.map, DataLoader) puts
//! them in the child's environment before exec, never on its command line.
std::vector<std::string> redis_child_environment();

//! `text` with every occurrence of `secret` (when non-empty) replaced by "***"
std::string redact_secret(std::string text, const std::string& secret);
//! a redis:// URL with its secrets hidden: the password of "user:password@" and the value of a "password=" query
//! parameter become "***" (any other text is returned as it is)
std::string redact_redis_url(const std::string& url);

//! throws the error of an error reply: ValueError when the caller's arguments are at fault (too large
//! a value, offset out of range), else BackendError; `context` prefixes Redis's text
[[noreturn]] void redis_reply_error(const RedisReply& reply, const std::string& context);

}  // namespace backends
}  // namespace tensordict
