#include "tensordict/backends/redis_client.hpp"

// sds.h (hiredis's string buffer, c->obuf) has no extern "C" guard of its own
extern "C" {
#include <hiredis/sds.h>
}
#include <hiredis/hiredis.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include "tensordict/errors.hpp"

namespace tensordict {
namespace backends {

RedisCommand& RedisCommand::arg(int64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return arg_copy(buf, static_cast<size_t>(r.ptr - buf));
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

void RedisClient::lost(const std::string& what, const std::string& reason) {
  std::string why = !reason.empty() ? reason : ctx_ && ctx_->err ? std::string(ctx_->errstr) : std::string("connection closed");
  disconnect();
  throw BackendError("connection to Redis at " + endpoint() + " lost during " + what + ": " + why +
                     " (the request may not have been applied; the next call reconnects)");
}

std::vector<RedisReply> RedisClient::roundtrip(const std::vector<const RedisCommand*>& cmds) {
  auto first = [&] { return cmds.empty() || !cmds.front()->size() ? std::string("a request") : cmds.front()->at(0); };
  for (const RedisCommand* c : cmds) {
    c->fill_argv(argv_, argvlen_);
    if (redisAppendCommandArgv(ctx_, static_cast<int>(c->size()), argv_.data(), argvlen_.data()) != REDIS_OK)
      lost(first());
  }
  // The output buffer is sent here with send(MSG_NOSIGNAL) rather than by hiredis's write(2): a connection the
  // server closed must fail this call, not raise SIGPIPE (which kills the process). hiredis then only reads.
  {
    const char* buf = ctx_->obuf;
    size_t len = sdslen(ctx_->obuf), done = 0;
    while (done < len) {
      ssize_t n = ::send(ctx_->fd, buf + done, len - done, MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      int err = n < 0 ? errno : EPIPE;
      lost(first(), err == EAGAIN || err == EWOULDBLOCK ? std::string("send timed out") : std::strerror(err));
    }
    sdsfree(ctx_->obuf);
    ctx_->obuf = sdsempty();
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
  static const RedisCommand multi{"MULTI"}, exec{"EXEC"};  // read only: shared by every client
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
