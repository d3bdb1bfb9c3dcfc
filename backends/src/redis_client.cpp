#include "tensordict/backends/redis_client.hpp"

#include <hiredis/hiredis.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <charconv>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
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
size_t digits(size_t n) {
  size_t d = 1;
  while (n >= 10) {
    n /= 10;
    ++d;
  }
  return d;
}
}  // namespace

size_t RedisCommand::resp_size() const {
  size_t need = 3 + digits(args_.size());
  for (const Arg& a : args_) need += 5 + digits(a.len) + a.len;
  return need;
}

char* RedisCommand::write_resp(char* p) const {
  auto line = [&](char tag, size_t n) {
    *p++ = tag;
    p = std::to_chars(p, p + 20, n).ptr;
    *p++ = '\r';
    *p++ = '\n';
  };
  line('*', args_.size());
  for (const Arg& a : args_) {
    line('$', a.len);
    if (a.len) std::memcpy(p, a.view ? a.view : arena_.data() + a.off, a.len);
    p += a.len;
    *p++ = '\r';
    *p++ = '\n';
  }
  return p;
}

namespace {

timeval to_timeval(int ms) {
  timeval tv;
  tv.tv_sec = ms / 1000;
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  return tv;
}

//! "5 s", "0.5 s", "1.25 s"
std::string seconds_text(int ms) {
  std::string s = std::to_string(ms / 1000);
  int frac = ms % 1000;
  if (frac != 0) {
    char buf[8];
    std::snprintf(buf, sizeof buf, ".%03d", frac);
    std::string f = buf;
    while (f.back() == '0') f.pop_back();
    s += f;
  }
  return s + " s";
}

const char* const kNoReply = "no reply from ";

std::string env_suffix(const std::string& endpoint) {
  std::string out;
  for (char c : endpoint) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out;
}

std::string env_or_empty(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  return v ? std::string(v) : std::string();
}

//! the credentials this process authenticated with, per endpoint (for its worker processes' environment)
struct CredentialRegistry {
  std::mutex mu;
  std::map<std::string, RedisCredentials> by_endpoint;
};
CredentialRegistry& credential_registry() {
  static CredentialRegistry r;
  return r;
}

}  // namespace

std::string redis_password_env_name(const std::string& endpoint) {
  return "TENSORDICT_REDIS_PASSWORD_" + env_suffix(endpoint);
}
std::string redis_user_env_name(const std::string& endpoint) { return "TENSORDICT_REDIS_USER_" + env_suffix(endpoint); }

RedisCredentials redis_env_credentials(const std::string& endpoint) {
  RedisCredentials c;
  c.password = env_or_empty(redis_password_env_name(endpoint));
  if (!c.password.empty()) {
    c.user = env_or_empty(redis_user_env_name(endpoint));
    return c;
  }
  c.password = env_or_empty("TENSORDICT_REDIS_PASSWORD");
  c.user = env_or_empty("TENSORDICT_REDIS_USER");
  return c;
}

std::vector<std::string> redis_child_environment() {
  std::lock_guard<std::mutex> lock(credential_registry().mu);
  std::vector<std::string> out;
  for (const auto& kv : credential_registry().by_endpoint) {
    out.push_back(redis_password_env_name(kv.first) + "=" + kv.second.password);
    out.push_back(redis_user_env_name(kv.first) + "=" + kv.second.user);
  }
  return out;
}

std::string redact_secret(std::string text, const std::string& secret) {
  if (secret.empty()) return text;
  for (size_t at = text.find(secret); at != std::string::npos; at = text.find(secret, at + 3))
    text.replace(at, secret.size(), "***");
  return text;
}

std::string redact_redis_url(const std::string& url) {
  std::string out = url;
  // "user:password@": up to the last '@' of the text (a password may hold '/', '?' or '#' unencoded; a query
  // value holding '@' then hides more than needed, never less)
  const size_t scheme = out.find("://");
  const size_t start = scheme == std::string::npos ? 0 : scheme + 3;
  const size_t at = out.rfind('@');
  if (scheme != std::string::npos && at != std::string::npos && at >= start) {
    const size_t colon = out.find(':', start);
    if (colon != std::string::npos && colon < at && out.find_first_of("@/?#", start) > colon) {
      out.replace(colon + 1, at - colon - 1, "***");  // the user name stays
    } else {
      out.replace(start, at - start, "***");  // "redis://secret@host": a lone userinfo is the password
    }
  }
  // query parameters named password (any case)
  for (size_t q = out.find_first_of("?&"); q != std::string::npos; q = out.find('&', q + 1)) {
    const size_t eq = out.find('=', q + 1);
    const size_t amp = out.find('&', q + 1);
    if (eq == std::string::npos || (amp != std::string::npos && amp < eq)) continue;
    std::string name = out.substr(q + 1, eq - q - 1);
    for (auto& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (name == "password" || name == "pass" || name == "pw") {
      const size_t stop = amp == std::string::npos ? out.size() : amp;
      out.replace(eq + 1, stop - eq - 1, "***");
    }
  }
  return out;
}

[[noreturn]] void redis_reply_error(const RedisReply& reply, const std::string& context) {
  const std::string& t = reply.str;
  std::string msg = context.empty() ? t : context + ": " + t;
  if (t.find("exceeds maximum allowed size") != std::string::npos ||
      t.find("out of range") != std::string::npos || t.find("offset is out of range") != std::string::npos)
    throw ValueError(msg);
  throw BackendError(msg);
}

RedisClient::RedisClient(RedisConnectOptions options) : options_(std::move(options)) {
  if (options_.password.empty()) {
    RedisCredentials env = redis_env_credentials(endpoint());
    options_.password = env.password;
    if (options_.user.empty()) options_.user = env.user;
  }
  ensure_connected();
}

RedisClient::~RedisClient() { disconnect(); }

std::string RedisClient::endpoint() const {
  if (!options_.unix_socket.empty()) return options_.unix_socket;
  return options_.host + ":" + std::to_string(options_.port);
}

namespace {
//! a command's name, for a message
std::string name_of(const RedisCommand* cmd) { return cmd && cmd->size() ? cmd->at(0) : std::string("a request"); }
}  // namespace

void RedisClient::disconnect() {
  if (ctx_) {
    redisFree(ctx_);
    ctx_ = nullptr;
  }
  rpos_ = rend_ = 0;  // what a lost connection left unread belongs to no later request
}

void RedisClient::read_more(const RedisCommand* cmd) {
  constexpr size_t kChunk = 64 * 1024;
  if (rpos_ == rend_) {
    rpos_ = rend_ = 0;
  } else if (rpos_ > 0 && rbuf_.size() - rend_ < kChunk) {  // keep the unparsed tail, at the front
    std::memmove(rbuf_.data(), rbuf_.data() + rpos_, rend_ - rpos_);
    rend_ -= rpos_;
    rpos_ = 0;
  }
  if (rbuf_.size() - rend_ < kChunk) rbuf_.resize(std::max(rbuf_.size() * 2, rend_ + kChunk));
  rend_ += recv_some(rbuf_.data() + rend_, rbuf_.size() - rend_, cmd);
}

size_t RedisClient::recv_some(char* to, size_t n, const RedisCommand* cmd) {
  for (;;) {
    const ssize_t k = ::recv(ctx_->fd, to, n, 0);
    if (k > 0) return static_cast<size_t>(k);
    if (k < 0 && errno == EINTR) continue;
    // SO_RCVTIMEO expired on one read: nothing arrived for command_timeout_ms
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) silent(name_of(cmd));
    lost(name_of(cmd), k == 0 ? std::string("connection closed") : std::string(std::strerror(errno)));
  }
}

std::string_view RedisClient::read_line(const RedisCommand* cmd) {
  size_t from = rpos_;
  for (;;) {
    const char* begin = rbuf_.data();
    const void* cr = from < rend_ ? std::memchr(begin + from, '\r', rend_ - from) : nullptr;
    if (cr) {
      const size_t at = static_cast<size_t>(static_cast<const char*>(cr) - begin);
      if (at + 1 < rend_) {
        if (begin[at + 1] != '\n') lost(name_of(cmd), "protocol error: a reply line without its \\r\\n");
        std::string_view line(begin + rpos_, at - rpos_);
        rpos_ = at + 2;
        return line;
      }
      from = at;  // the '\n' is still to come
    } else {
      from = rend_;
    }
    const size_t kept = from - rpos_;
    if (kept > (size_t{1} << 20)) lost(name_of(cmd), "protocol error: a reply line longer than 1 MiB");
    read_more(cmd);  // may move the unparsed bytes to the front
    from = rpos_ + kept;
  }
}

void RedisClient::read_reply(RedisReply& out, const RedisCommand* cmd, int depth) {
  if (depth > 16) lost(name_of(cmd), "protocol error: replies nested deeper than 16");
  const std::string_view line = read_line(cmd);
  if (line.empty()) lost(name_of(cmd), "protocol error: an empty reply line");
  auto number = [&](std::string_view digits) {
    int64_t v = 0;
    const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (r.ec != std::errc() || r.ptr != digits.data() + digits.size())
      lost(name_of(cmd), "protocol error: '" + std::string(digits.substr(0, 32)) + "' is not a length or an integer");
    return v;
  };
  const std::string_view rest = line.substr(1);
  auto length_or_nil = [&] {  // "$-1" / "*-1": a nil reply
    const int64_t v = number(rest);
    if (v < 0) out.type = RedisReply::Type::Nil;
    return v;
  };
  switch (line[0]) {
    case '+':
      out.type = RedisReply::Type::Status;
      out.str.assign(rest.data(), rest.size());
      return;
    case '-':
      out.type = RedisReply::Type::Error;
      out.str.assign(rest.data(), rest.size());
      return;
    case ':':
      out.type = RedisReply::Type::Integer;
      out.integer = number(rest);
      return;
    case '$': {
      const int64_t len = length_or_nil();
      if (len < 0) return;
      out.type = RedisReply::Type::String;
      const size_t n = static_cast<size_t>(len);
      const size_t have = std::min(n, rend_ - rpos_);
      out.str.assign(rbuf_.data() + rpos_, have);
      rpos_ += have;
      if (have < n) {  // a large value: the rest straight into the string, not through the buffer
        out.str.resize(n);
        for (size_t done = have; done < n;) done += recv_some(&out.str[done], n - done, cmd);
      }
      if (!read_line(cmd).empty()) lost(name_of(cmd), "protocol error: a bulk string longer than its length");
      return;
    }
    case '*': {
      const int64_t count = length_or_nil();
      if (count < 0) return;
      out.type = RedisReply::Type::Array;
      out.elements.clear();
      out.elements.reserve(static_cast<size_t>(std::min<int64_t>(count, 1 << 16)));
      for (int64_t i = 0; i < count; ++i) read_reply(out.elements.emplace_back(), cmd, depth + 1);
      return;
    }
    default:
      lost(name_of(cmd), "protocol error: a reply starting with byte " + std::to_string(static_cast<unsigned char>(line[0])));
  }
}

bool RedisClient::skip_line(std::string_view line) {
  if (rend_ - rpos_ < line.size() + 2) return false;  // not all here: read_reply waits for it
  const char* p = rbuf_.data() + rpos_;
  if (std::memcmp(p, line.data(), line.size()) != 0 || p[line.size()] != '\r' || p[line.size() + 1] != '\n')
    return false;
  rpos_ += line.size() + 2;
  return true;
}

bool RedisClient::skip_integer(const RedisCommand* cmd) {
  if (rpos_ == rend_) read_more(cmd);
  if (rbuf_[rpos_] != ':') return false;
  const std::string_view line = read_line(cmd);
  // its value is not wanted, only checked: [-]digits, at most 19 of them (std::from_chars cost 140 instructions)
  const size_t first = line.size() > 1 && line[1] == '-' ? 2 : 1;
  bool ok = line.size() > first && line.size() - first <= 19;
  for (size_t i = first; ok && i < line.size(); ++i) ok = line[i] >= '0' && line[i] <= '9';
  if (!ok) lost(name_of(cmd), "protocol error: '" + std::string(line.substr(0, 32)) + "' is not an integer reply");
  return true;
}

int64_t RedisClient::array_header(const RedisCommand* cmd) {
  if (rpos_ == rend_) read_more(cmd);
  if (rbuf_[rpos_] != '*') return -1;
  const std::string_view line = read_line(cmd);
  int64_t n = 0;
  const auto r = std::from_chars(line.data() + 1, line.data() + line.size(), n);
  if (line.size() < 2 || r.ec != std::errc() || r.ptr != line.data() + line.size() || n < -1)
    lost(name_of(cmd), "protocol error: '" + std::string(line.substr(0, 32)) + "' is not an array length");
  return n < 0 ? -2 : n;
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
    throw BackendError(redact_secret("cannot connect to Redis at " + endpoint() + ": " + why, options_.password));
  }
  if (options_.command_timeout_ms > 0) redisSetTimeout(c, to_timeval(options_.command_timeout_ms));
  if (options_.unix_socket.empty()) redisEnableKeepAlive(c);
  ctx_ = c;
  ++connections_;
  // handshake in one round trip: AUTH, SELECT, PING (PING reveals a server that needs a password)
  std::vector<RedisCommand> hello;
  if (!options_.password.empty()) {
    hello.push_back(options_.user.empty() ? RedisCommand{"AUTH", options_.password}
                                          : RedisCommand{"AUTH", options_.user, options_.password});
  }
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
    const std::string text = redact_secret(replies[i].str, options_.password);
    if (what == "AUTH" || text.rfind("NOAUTH", 0) == 0 || text.rfind("WRONGPASS", 0) == 0) {
      throw BackendError("authentication failed at Redis " + endpoint() +
                         (options_.user.empty() ? std::string() : " as user '" + options_.user + "'") + ": " + text +
                         (options_.password.empty() ? " (no password given: pass one in the options or the URL, or "
                                                      "set TENSORDICT_REDIS_PASSWORD)"
                                                    : ""));
    }
    if (what == "SELECT")
      throw BackendError("cannot select db " + std::to_string(options_.db) + " at Redis " + endpoint() + ": " + text);
    throw BackendError("Redis at " + endpoint() + " refused the connection: " + text);
  }
  if (!options_.password.empty()) {
    std::lock_guard<std::mutex> lock(credential_registry().mu);
    credential_registry().by_endpoint[endpoint()] = RedisCredentials{options_.user, options_.password};
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
      // a refused password will not get better by retrying, and a silent server would multiply the wait
      if (m.find("authentication failed") != std::string::npos || m.find(kNoReply) != std::string::npos ||
          i + 1 >= attempts) {
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
  throw BackendError(redact_secret("connection to Redis at " + endpoint() + " lost during " + what + ": " + why +
                                       " (the request may not have been applied; the next call reconnects)",
                                   options_.password));
}

void RedisClient::silent(const std::string& what) {
  disconnect();
  throw BackendError(std::string("Redis: ") + kNoReply + endpoint() + " within " +
                     seconds_text(options_.command_timeout_ms) + " (during " + what +
                     "; the reply timeout counts from the last byte received; the request may not have been "
                     "applied; the next call reconnects)");
}

void RedisClient::send_all(const std::vector<const RedisCommand*>& cmds) {
  auto first = [&] { return cmds.empty() || !cmds.front()->size() ? std::string("a request") : cmds.front()->at(0); };
  // the commands are formatted here into one reused buffer (hiredis's own output buffer stays empty) and sent with
  // send(MSG_NOSIGNAL) rather than by hiredis's write(2): a connection the server closed must fail this call, not
  // raise SIGPIPE (which kills the process). hiredis then only reads.
  size_t len = 0;
  for (const RedisCommand* c : cmds) len += c->resp_size();
  if (len > wcap_) {
    wbuf_.reset();
    wbuf_.reset(new char[len]);
    wcap_ = len;
  }
  char* end = wbuf_.get();
  for (const RedisCommand* c : cmds) end = c->write_resp(end);
  const char* buf = wbuf_.get();
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::send(ctx_->fd, buf + done, len - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    int err = n < 0 ? errno : EPIPE;
    lost(first(), err == EAGAIN || err == EWOULDBLOCK
                      ? "the server took no data for " + seconds_text(options_.command_timeout_ms)
                      : std::string(std::strerror(err)));
  }
  if (wcap_ > (size_t{64} << 20)) {  // a one-off huge write keeps no memory
    wbuf_.reset();
    wcap_ = 0;
  }
}

std::vector<RedisReply> RedisClient::roundtrip(const std::vector<const RedisCommand*>& cmds) {
  send_all(cmds);
  std::vector<RedisReply> out(cmds.size());
  for (size_t i = 0; i < cmds.size(); ++i) read_reply(out[i], cmds[i], 0);
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
  if (r[0].is_error()) {
    r[0].str = redact_secret(r[0].str, options_.password);
    redis_reply_error(r[0], "Redis " + endpoint() + " " + (cmd.size() ? cmd.at(0) : ""));
  }
  return std::move(r[0]);
}

namespace {
const RedisCommand& multi_cmd() {
  static const RedisCommand multi{"MULTI"};  // read only: shared by every client
  return multi;
}
const RedisCommand& exec_cmd() {
  static const RedisCommand exec{"EXEC"};
  return exec;
}
}  // namespace

const std::vector<const RedisCommand*>& RedisClient::transaction_of(const std::vector<RedisCommand>& cmds) {
  ptrs_.clear();
  ptrs_.reserve(cmds.size() + 2);
  ptrs_.push_back(&multi_cmd());
  for (const auto& c : cmds) ptrs_.push_back(&c);
  ptrs_.push_back(&exec_cmd());
  return ptrs_;
}

template <class Queued>
void RedisClient::check_transaction(const RedisReply& multi, const RedisReply& exec, size_t replies,
                                    const std::vector<RedisCommand>& cmds, Queued&& queued) {
  if (multi.is_error()) redis_reply_error(multi, "Redis " + endpoint() + " MULTI");
  if (exec.is_error()) {
    // EXECABORT: a command was refused while queueing; report the first refusal (nothing was applied)
    for (size_t i = 0; i < cmds.size(); ++i)
      if (const RedisReply* r = queued(i); r && r->is_error())
        redis_reply_error(*r, "Redis " + endpoint() + " " + cmds[i].at(0) + " (transaction not applied)");
    redis_reply_error(exec, "Redis " + endpoint() + " EXEC");
  }
  if (!exec.is_array() || replies != cmds.size())
    throw BackendError("Redis " + endpoint() + ": unexpected EXEC reply (transaction aborted)");
}

std::vector<RedisReply> RedisClient::transaction(const std::vector<RedisCommand>& cmds) {
  if (cmds.empty()) return {};
  ensure_connected();
  std::vector<RedisReply> r = roundtrip(transaction_of(cmds));
  check_transaction(r.front(), r.back(), r.back().elements.size(), cmds, [&](size_t i) { return &r[i + 1]; });
  return std::move(r.back().elements);
}

std::vector<RedisReply> RedisClient::read_together(const std::vector<RedisCommand>& cmds) {
  try {
    return transaction(cmds);
  } catch (const BackendError& e) {
    // the server's out-of-memory refusal of the queued commands ("-OOM command not allowed ..."): nothing ran
    if (std::string(e.what()).find("OOM command not allowed") == std::string::npos) throw;
  }
  return pipeline(cmds);
}

std::vector<std::pair<size_t, RedisReply>> RedisClient::transaction_errors(const std::vector<RedisCommand>& cmds) {
  if (cmds.empty()) return {};
  ensure_connected();
  const std::vector<const RedisCommand*>& ptrs = transaction_of(cmds);
  send_all(ptrs);
  // every reply is read before anything is thrown (what is left unread would answer the next request)
  RedisReply multi;
  read_reply(multi, ptrs.front(), 0);
  std::vector<std::pair<size_t, RedisReply>> refused;  // while queueing (rare: EXECABORT follows)
  RedisReply reply;
  for (size_t i = 0; i < cmds.size(); ++i) {
    if (skip_line("+QUEUED")) continue;  // the common reply, straight from the buffer
    read_reply(reply, ptrs[i + 1], 0);
    if (reply.is_error()) refused.emplace_back(i, std::move(reply));
  }
  // EXEC: an array of one reply per command. Integer replies (SETRANGE's) are checked in the buffer; the others
  // are read, and kept when they are errors
  std::vector<std::pair<size_t, RedisReply>> errors;
  const int64_t count = array_header(ptrs.back());
  RedisReply exec;
  if (count == -1) {
    read_reply(exec, ptrs.back(), 0);  // not an array: an error (EXECABORT)
  } else if (count >= 0) {
    exec.type = RedisReply::Type::Array;  // its elements are not kept: check_transaction gets their count
    for (int64_t i = 0; i < count; ++i) {
      if (skip_integer(ptrs.back())) continue;
      read_reply(reply, ptrs.back(), 1);
      if (reply.is_error()) errors.emplace_back(static_cast<size_t>(i), std::move(reply));
    }
  }
  check_transaction(multi, exec, static_cast<size_t>(std::max<int64_t>(count, 0)), cmds, [&](size_t i) -> const RedisReply* {
    for (const auto& [at, r] : refused)
      if (at == i) return &r;
    return nullptr;
  });
  return errors;
}

}  // namespace backends
}  // namespace tensordict
