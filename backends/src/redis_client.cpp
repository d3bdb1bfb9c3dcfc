#include "tensordict/backends/redis_client.hpp"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>
#include <time.h>

#include <cerrno>
#include <chrono>
#include <memory>
#include <thread>

#include "tensordict/errors.hpp"

namespace tensordict {
namespace backends {

RedisCommand& RedisCommand::operator=(const RedisCommand& o) {
  if (this == &o) return *this;
  owned_.clear();
  ptrs_.clear();
  lens_.clear();
  owned_index_.clear();
  for (size_t i = 0; i < o.ptrs_.size(); ++i) {
    if (o.owned_index_[i] >= 0)
      arg(o.owned_[static_cast<size_t>(o.owned_index_[i])]);
    else
      arg_view(o.ptrs_[i], o.lens_[i]);
  }
  return *this;
}

namespace {

timeval to_timeval(int ms) {
  timeval tv;
  tv.tv_sec = ms / 1000;
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  return tv;
}

RedisReply convert(const redisReply* r) {
  RedisReply out;
  if (r == nullptr) return out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out.type = RedisReply::Type::String;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = RedisReply::Type::Status;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = RedisReply::Type::Error;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = RedisReply::Type::Integer;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = RedisReply::Type::Array;
      out.elements.reserve(r->elements);
      for (size_t i = 0; i < r->elements; ++i) out.elements.push_back(convert(r->element[i]));
      break;
    default:
      out.type = RedisReply::Type::Nil;
  }
  return out;
}

//! hiredis writes with write(2): a server that closed the connection would raise SIGPIPE and kill the process.
//! SIGPIPE is blocked on this thread during the I/O; one it raised is consumed before the mask is restored.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    blocked_ = pthread_sigmask(SIG_BLOCK, &pipe_, &old_) == 0;
  }
  ~SigpipeGuard() {
    if (!blocked_) return;
    if (!was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        timespec zero{0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) == -1 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
  bool blocked_ = false;
};

struct ReplyFree {
  void operator()(void* r) const {
    if (r) freeReplyObject(r);
  }
};

}  // namespace

[[noreturn]] void redis_reply_error(const RedisReply& reply, const std::string& context) {
  const std::string& t = reply.str;
  std::string msg = context.empty() ? t : context + ": " + t;
  if (t.find("exceeds maximum allowed size") != std::string::npos ||
      t.find("out of range") != std::string::npos || t.find("offset is out of range") != std::string::npos)
    throw ValueError(msg);
  throw BackendError(msg);
}

RedisClient::RedisClient(RedisConnectOptions options) : options_(std::move(options)) { ensure_connected(); }

RedisClient::~RedisClient() { disconnect(); }

std::string RedisClient::endpoint() const {
  if (!options_.unix_socket.empty()) return options_.unix_socket;
  return options_.host + ":" + std::to_string(options_.port);
}

void RedisClient::disconnect() {
  if (ctx_) {
    redisFree(ctx_);
    ctx_ = nullptr;
  }
}

void RedisClient::connect_once() {
  timeval tv = to_timeval(options_.connect_timeout_ms > 0 ? options_.connect_timeout_ms : 2000);
  redisContext* c = options_.unix_socket.empty()
                        ? redisConnectWithTimeout(options_.host.c_str(), options_.port, tv)
                        : redisConnectUnixWithTimeout(options_.unix_socket.c_str(), tv);
  if (c == nullptr) throw BackendError("cannot connect to Redis at " + endpoint() + ": out of memory");
  if (c->err) {
    std::string why = c->errstr;
    redisFree(c);
    throw BackendError("cannot connect to Redis at " + endpoint() + ": " + why);
  }
  if (options_.command_timeout_ms > 0) redisSetTimeout(c, to_timeval(options_.command_timeout_ms));
  if (options_.unix_socket.empty()) redisEnableKeepAlive(c);
  ctx_ = c;
  ++connections_;
  // handshake in one round trip: AUTH, SELECT, PING (PING reveals a server that needs a password)
  std::vector<RedisCommand> hello;
  if (!options_.password.empty()) hello.push_back(RedisCommand{"AUTH", options_.password});
  if (options_.db != 0) hello.push_back(RedisCommand{"SELECT", std::to_string(options_.db)});
  hello.push_back(RedisCommand{"PING"});
  std::vector<const RedisCommand*> ptrs;
  for (const auto& h : hello) ptrs.push_back(&h);
  std::vector<RedisReply> replies;
  try {
    replies = roundtrip(ptrs);
  } catch (...) {
    disconnect();
    throw;
  }
  for (size_t i = 0; i < replies.size(); ++i) {
    if (!replies[i].is_error()) continue;
    disconnect();
    const std::string& what = hello[i].at(0);
    if (what == "AUTH" || replies[i].str.rfind("NOAUTH", 0) == 0 || replies[i].str.rfind("WRONGPASS", 0) == 0)
      throw BackendError("authentication failed at Redis " + endpoint() + ": " + replies[i].str);
    if (what == "SELECT")
      throw BackendError("cannot select db " + std::to_string(options_.db) + " at Redis " + endpoint() + ": " +
                         replies[i].str);
    throw BackendError("Redis at " + endpoint() + " refused the connection: " + replies[i].str);
  }
}

void RedisClient::ensure_connected() {
  if (ctx_) return;
  int attempts = options_.retries < 1 ? 1 : options_.retries;
  for (int i = 0;; ++i) {
    try {
      connect_once();
      return;
    } catch (const BackendError& e) {
      std::string m = e.message();
      // a refused password will not get better by retrying
      if (m.find("authentication failed") != std::string::npos || i + 1 >= attempts) {
        if (i > 0) throw BackendError(m + " (after " + std::to_string(i + 1) + " attempts)");
        throw;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(options_.retry_delay_ms > 0 ? options_.retry_delay_ms : 0));
  }
}

void RedisClient::lost(const std::string& what) {
  std::string why = ctx_ && ctx_->err ? std::string(ctx_->errstr) : std::string("connection closed");
  disconnect();
  throw BackendError("connection to Redis at " + endpoint() + " lost during " + what + ": " + why +
                     " (the request may not have been applied; the next call reconnects)");
}

std::vector<RedisReply> RedisClient::roundtrip(const std::vector<const RedisCommand*>& cmds) {
  SigpipeGuard no_sigpipe;
  for (const RedisCommand* c : cmds) {
    if (redisAppendCommandArgv(ctx_, static_cast<int>(c->size()), const_cast<const char**>(c->argv()),
                               c->argvlen()) != REDIS_OK)
      lost(cmds.empty() ? "a request" : (cmds.front()->size() ? cmds.front()->at(0) : "a request"));
  }
  std::vector<RedisReply> out;
  out.reserve(cmds.size());
  for (size_t i = 0; i < cmds.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) {
      if (raw) freeReplyObject(raw);
      lost(cmds[i]->size() ? cmds[i]->at(0) : "a request");
    }
    std::unique_ptr<void, ReplyFree> guard(raw);
    out.push_back(convert(static_cast<redisReply*>(raw)));
  }
  return out;
}

std::vector<RedisReply> RedisClient::pipeline(const std::vector<RedisCommand>& cmds) {
  if (cmds.empty()) return {};
  ensure_connected();
  std::vector<const RedisCommand*> ptrs;
  ptrs.reserve(cmds.size());
  for (const auto& c : cmds) ptrs.push_back(&c);
  return roundtrip(ptrs);
}

RedisReply RedisClient::command(const RedisCommand& cmd) {
  ensure_connected();
  std::vector<RedisReply> r = roundtrip({&cmd});
  if (r[0].is_error()) redis_reply_error(r[0], "Redis " + endpoint() + " " + (cmd.size() ? cmd.at(0) : ""));
  return std::move(r[0]);
}

std::vector<RedisReply> RedisClient::transaction(const std::vector<RedisCommand>& cmds) {
  if (cmds.empty()) return {};
  ensure_connected();
  RedisCommand multi{"MULTI"}, exec{"EXEC"};
  std::vector<const RedisCommand*> ptrs;
  ptrs.reserve(cmds.size() + 2);
  ptrs.push_back(&multi);
  for (const auto& c : cmds) ptrs.push_back(&c);
  ptrs.push_back(&exec);
  std::vector<RedisReply> r = roundtrip(ptrs);
  if (r.front().is_error()) redis_reply_error(r.front(), "Redis " + endpoint() + " MULTI");
  RedisReply& ex = r.back();
  if (ex.is_error()) {
    // EXECABORT: a command was refused while queueing; report the first refusal (nothing was applied)
    for (size_t i = 1; i + 1 < r.size(); ++i)
      if (r[i].is_error()) redis_reply_error(r[i], "Redis " + endpoint() + " " + cmds[i - 1].at(0) + " (transaction not applied)");
    redis_reply_error(ex, "Redis " + endpoint() + " EXEC");
  }
  if (!ex.is_array() || ex.elements.size() != cmds.size())
    throw BackendError("Redis " + endpoint() + ": unexpected EXEC reply (transaction aborted)");
  return std::move(ex.elements);
}

}  // namespace backends
}  // namespace tensordict
