// Actor-layer costs, as one JSON object on stdout:
//  - facade round trip (Engine::ping: anon_send + Reply slot, to the engine's echo HotActor) vs a raw
//    caf::scoped_actor request/receive to the same actor and to an event-based (scheduled) echo, vs an
//    actor-to-actor request/response ping-pong between scheduled actors;
//  - per-chunk overhead of map with tiny chunks (identity fn, chunksize 1);
//  - map throughput of a cheap fn (x+1) over 10,000 rows with 2 workers and chunks of 1,000, vs a
//    single-thread loop over the same chunks.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "bench_map_fns.hpp"
#include "tensordict/actors/messages.hpp"
#include "tensordict/actors/reply.hpp"
#include "tensordict/actors/runtime.hpp"
#include "tensordict/tensordict.hpp"

using namespace tensordict;
using clk = std::chrono::steady_clock;

namespace {

struct Stats {
  double median_us, p99_us, mean_us;
};

Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  return {v[v.size() / 2], v[std::min(v.size() - 1, v.size() * 99 / 100)], sum / static_cast<double>(v.size())};
}

double us_since(clk::time_point t0) { return std::chrono::duration<double, std::micro>(clk::now() - t0).count(); }

template <class F>
Stats time_each(int n, F&& f) {
  for (int i = 0; i < n / 10; ++i) f();  // warm-up
  std::vector<double> v;
  v.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    auto t0 = clk::now();
    f();
    v.push_back(us_since(t0));
  }
  return stats(std::move(v));
}

std::string json(const Stats& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "{\"median_us\": %.2f, \"p99_us\": %.2f, \"mean_us\": %.2f}", s.median_us, s.p99_us,
                s.mean_us);
  return buf;
}

// an event-based echo on the scheduler (the engine's echo actor is a HotActor with a thread of its own)
caf::behavior scheduled_echo(caf::event_based_actor*) {
  return {[](actors::ping_atom, int64_t x) { return x; }};
}

// actor-to-actor: a pinger does `n` sequential request/response round trips with an echo actor
caf::behavior pinger(caf::event_based_actor* self, caf::actor echo, int64_t n,
                     std::shared_ptr<actors::Inbox<int64_t>> done) {
  auto step = std::make_shared<std::function<void(int64_t)>>();
  *step = [=](int64_t i) {
    if (i == n) {
      done->push(i);
      self->quit();
      return;
    }
    self->request(echo, caf::infinite, actors::ping_atom::value, i).then([=](int64_t) { (*step)(i + 1); });
  };
  (*step)(0);
  return {[](int64_t) {}};
}

//! the scheduler policies side by side (one Engine each, same process): facade and raw request medians,
//! after-idle facade, tiny-chunk overhead, cheap and heavy map throughput
std::string policy_figures(const std::string& name, const Config& cfg) {
  Engine e(cfg);
  auto rt = e.runtime();
  std::vector<double> ping, raw, idle;
  {
    caf::scoped_actor self{rt->system()};
    for (int b = 0; b < 10; ++b) {
      for (int i = 0; i < 500; ++i) {
        auto t0 = clk::now();
        e.ping(1);
        ping.push_back(us_since(t0));
      }
      for (int i = 0; i < 500; ++i) {
        auto t0 = clk::now();
        self->request(rt->echo(), std::chrono::seconds(5), actors::ping_atom::value, int64_t{1})
            .receive([](int64_t) {}, [](caf::error&) { std::abort(); });
        raw.push_back(us_since(t0));
      }
    }
    for (int i = 0; i < 300; ++i) {
      std::this_thread::sleep_for(std::chrono::microseconds(300));
      auto t0 = clk::now();
      e.ping(1);
      idle.push_back(us_since(t0));
    }
  }
  TensorDict td({{"x", at::randn({10000, 64})}, {"y", at::randn({10000, 16})}}, {10000});
  MapFn id = benchutil::identity_fn();
  MapFn cheap = benchutil::cheap_fn();
  MapFn heavy = benchutil::heavy_fn();
  auto seconds_per = [&](int reps, const MapFn& fn, const MapOptions& o) {
    e.map(td, fn, o);  // warm-up
    auto t0 = clk::now();
    for (int i = 0; i < reps; ++i) e.map(td, fn, o);
    return us_since(t0) / 1e6 / reps;
  };
  const double tiny = seconds_per(3, id, MapOptions().chunksize(1).num_workers(2));
  const double cheap_s = seconds_per(20, cheap, MapOptions().chunksize(1000).num_workers(2));
  const double heavy1 = seconds_per(3, heavy, MapOptions().chunksize(500).num_workers(1));
  const double heavy2 = seconds_per(3, heavy, MapOptions().chunksize(500).num_workers(2));
  const Stats sp = stats(ping), sr = stats(raw), si = stats(idle);
  char buf[768];
  std::snprintf(buf, sizeof buf,
                "    \"%s\": {\"facade_median_us\": %.2f, \"raw_scoped_actor_median_us\": %.2f, "
                "\"facade_vs_raw\": %.2f, \"after_idle_facade_median_us\": %.2f, \"tiny_chunk_us\": %.2f, "
                "\"cheap_rows_per_s\": %.0f, \"heavy_two_vs_one\": %.2f}",
                name.c_str(), sp.median_us, sr.median_us, sp.median_us / sr.median_us, si.median_us, tiny * 1e6 / 10000,
                10000 / cheap_s, heavy1 / heavy2);
  return buf;
}

}  // namespace

int main() {
  const int kRounds = 20000;
  std::string out = "{\n";

  // ---- request costs, with the tuned default config (sharing, 2 threads)
  Config cfg = Config::load();
  Engine engine(cfg);
  auto rt = engine.runtime();
  // interleaved blocks (the machine is shared and noisy): the facade's reply slot with spin 0 / 20 / 50 us,
  // Engine::ping (config facade_spin_us), a raw scoped_actor request
  auto facade_with_spin = [&](int64_t spin_us) {
    auto box = std::make_shared<actors::Reply<int64_t>>();
    caf::anon_send(rt->echo(), actors::ping_atom::value, box, int64_t{1});
    if (!box->wait(clk::now() + std::chrono::seconds(5), std::chrono::microseconds(spin_us))) std::abort();
  };
  std::vector<double> v_spin0, v_spin20, v_spin50, v_raw, v_raw_sched, v_ping, v_idle_ping, v_idle_raw;
  {
    caf::scoped_actor self{rt->system()};
    caf::actor sched_echo = rt->system().spawn(scheduled_echo);
    auto raw_to = [&](const caf::actor& dest) {
      self->request(dest, std::chrono::seconds(5), actors::ping_atom::value, int64_t{1})
          .receive([](int64_t) {}, [](caf::error&) { std::abort(); });
    };
    auto raw = [&] { raw_to(rt->echo()); };
    auto block = [&](std::vector<double>& v, auto&& f) {
      for (int i = 0; i < kRounds / 10; ++i) {
        auto t0 = clk::now();
        f();
        v.push_back(us_since(t0));
      }
    };
    for (int b = 0; b < 10; ++b) {
      block(v_spin0, [&] { facade_with_spin(0); });
      block(v_spin20, [&] { facade_with_spin(20); });
      block(v_spin50, [&] { facade_with_spin(50); });
      block(v_ping, [&] { engine.ping(1); });
      block(v_raw, raw);
      block(v_raw_sched, [&] { raw_to(sched_echo); });
    }
    caf::anon_send_exit(sched_echo, caf::exit_reason::user_shutdown);
    // after idle: 300 us pauses let the scheduler threads fall asleep, so each request pays a wake-up
    for (int i = 0; i < 1000; ++i) {
      std::this_thread::sleep_for(std::chrono::microseconds(300));
      auto t0 = clk::now();
      if (i % 2) {
        engine.ping(1);
        v_idle_ping.push_back(us_since(t0));
      } else {
        raw();
        v_idle_raw.push_back(us_since(t0));
      }
    }
  }
  const Stats s_ping = stats(v_ping), s_raw = stats(v_raw);
  out += "  \"facade_round_trip_engine_ping\": " + json(s_ping) + ",\n";
  out += "  \"facade_round_trip_spin_0us\": " + json(stats(v_spin0)) + ",\n";
  out += "  \"facade_round_trip_spin_20us\": " + json(stats(v_spin20)) + ",\n";
  out += "  \"facade_round_trip_spin_50us\": " + json(stats(v_spin50)) + ",\n";
  out += "  \"raw_scoped_actor_request\": " + json(s_raw) + ",\n";
  out += "  \"raw_scoped_actor_request_to_scheduled_actor\": " + json(stats(v_raw_sched)) + ",\n";
  out += "  \"facade_vs_raw_scoped_actor_median\": " + std::to_string(s_ping.median_us / s_raw.median_us) + ",\n";
  out += "  \"after_idle_engine_ping\": " + json(stats(v_idle_ping)) + ",\n";
  out += "  \"after_idle_raw_scoped_actor_request\": " + json(stats(v_idle_raw)) + ",\n";
  double a2a_us;
  {
    auto done = std::make_shared<actors::Inbox<int64_t>>(std::chrono::microseconds(0));
    auto t0 = clk::now();
    caf::actor echo = rt->system().spawn(scheduled_echo);
    rt->system().spawn(pinger, echo, int64_t{kRounds}, done);
    done->pop();
    a2a_us = us_since(t0) / kRounds;
    // the pinger's self-referencing step function keeps a handle: stop the echo explicitly, or the
    // actor system would wait for it forever at exit
    caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
  }
  char buf[512];
  char buf_text[1024];
  std::snprintf(buf, sizeof buf, "  \"actor_to_actor_round_trip_us_scheduled\": %.2f,\n", a2a_us);
  out += buf;

  // ---- per-chunk overhead: 10,000 one-row chunks, identity fn
  {
    TensorDict td({{"x", at::randn({10000, 8})}}, {10000});
    MapFn id = [](const TensorDict& c) { return c; };
    auto t0 = clk::now();
    TensorDict r = td.map(id, MapOptions().chunksize(1).num_workers(2));
    const double total_us = us_since(t0);
    // the same work without actors: take each chunk, call fn, cat
    t0 = clk::now();
    std::vector<TensorDict> parts;
    parts.reserve(10000);
    for (const TensorDict& c : td.split(1, 0)) parts.push_back(id(c));
    TensorDict r2 = cat(parts, 0);
    const double local_us = us_since(t0);
    std::snprintf(buf, sizeof buf,
                  "  \"tiny_chunks\": {\"chunks\": 10000, \"workers\": 2, \"map_total_ms\": %.1f, "
                  "\"per_chunk_us\": %.2f, \"single_thread_split_fn_cat_ms\": %.1f, \"overhead_per_chunk_us\": %.2f},\n",
                  total_us / 1000, total_us / 10000, local_us / 1000, (total_us - local_us) / 10000);
    out += buf;
  }

  // ---- throughput: x + 1 over 10,000 rows x 64 f32, chunks of 1,000, 2 workers vs one thread
  {
    const int64_t rows = 10000;
    TensorDict td({{"x", at::randn({rows, 64})}, {"y", at::randn({rows, 16})}}, {rows});
    MapFn fn = [](const TensorDict& c) { return c.apply([](const at::Tensor& t) { return t + 1; }); };
    td.map(fn, MapOptions().chunksize(1000).num_workers(2));  // warm-up
    const int reps = 20;
    auto t0 = clk::now();
    for (int i = 0; i < reps; ++i) td.map(fn, MapOptions().chunksize(1000).num_workers(2));
    const double map_s = us_since(t0) / 1e6 / reps;
    t0 = clk::now();
    for (int i = 0; i < reps; ++i) {
      std::vector<TensorDict> parts;
      for (const TensorDict& c : td.split(1000, 0)) parts.push_back(fn(c));
      cat(parts, 0);
    }
    const double loop_s = us_since(t0) / 1e6 / reps;
    // fixed cost of one map call (spawn coordinator + 2 workers, 10 chunks, identity fn, cat)
    MapFn id = [](const TensorDict& c) { return c; };
    Stats call = time_each(200, [&] { td.map(id, MapOptions().chunksize(1000).num_workers(2)); });
    Stats iter_call = time_each(200, [&] {
      auto it = td.map_iter(id, MapOptions().chunksize(1000).num_workers(2));
      while (it.next()) {
      }
    });
    out += "  \"map_call_identity_10_chunks\": " + json(call) + ",\n";
    out += "  \"map_iter_call_identity_10_chunks\": " + json(iter_call) + ",\n";
    std::snprintf(buf, sizeof buf,
                  "  \"throughput_x_plus_1\": {\"rows\": %lld, \"chunk_rows\": 1000, \"workers\": 2, "
                  "\"map_rows_per_s\": %.0f, \"map_ms\": %.2f, \"single_thread_rows_per_s\": %.0f, "
                  "\"single_thread_ms\": %.2f}\n",
                  static_cast<long long>(rows), rows / map_s, map_s * 1e3, rows / loop_s, loop_s * 1e3);
    out += buf;
    // a heavier fn: 16 rounds of elementwise transcendental math per leaf (single-threaded kernels; a BLAS
    // matmul would already use both cores through OpenBLAS and hide what a second worker adds)
    MapFn heavy = [](const TensorDict& c) {
      return c.apply([](const at::Tensor& t) {
        at::Tensor x = t;
        for (int k = 0; k < 16; ++k) x = at::sin(x) * 1.1 + at::cos(x);
        return x;
      });
    };
    auto time_map = [&](int64_t workers) {
      td.map(heavy, MapOptions().chunksize(500).num_workers(workers));  // warm-up
      auto t = clk::now();
      for (int i = 0; i < 5; ++i) td.map(heavy, MapOptions().chunksize(500).num_workers(workers));
      return us_since(t) / 1e6 / 5;
    };
    const double heavy1 = time_map(1), heavy2 = time_map(2);
    t0 = clk::now();
    for (int i = 0; i < 5; ++i) {
      std::vector<TensorDict> parts;
      for (const TensorDict& c : td.split(500, 0)) parts.push_back(heavy(c));
      cat(parts, 0);
    }
    const double heavy_loop = us_since(t0) / 1e6 / 5;
    std::snprintf(buf, sizeof buf,
                  "  ,\"throughput_heavy\": {\"rows\": %lld, \"chunk_rows\": 500, \"one_worker_rows_per_s\": %.0f, "
                  "\"two_workers_rows_per_s\": %.0f, \"single_thread_rows_per_s\": %.0f, \"two_vs_one\": %.2f, "
                  "\"two_vs_loop\": %.2f}\n",
                  static_cast<long long>(rows), rows / heavy1, rows / heavy2, rows / heavy_loop, heavy1 / heavy2,
                  heavy_loop / heavy2);
    out += buf;
  }
  // ---- store: rows go straight to memory (snapshot + index), what the actor serialises takes one hop
  {
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() / ("td_bench_store_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    const int64_t rows = 10000;
    Schema schema = {{"x", {{64}, at::kFloat}}, {"y", {{16}, at::kFloat}}};
    TensorDict buf = TensorDict::from_schema(schema, {rows}, "memmap", MemmapOptions().prefix(dir.string()));
    buf.apply_([](const at::Tensor& t) { return t.fill_(1.0); });  // first touch outside the timings
    Store store = Store::open(buf);
    TensorDict row = buf.index({7}).clone();
    int64_t i = 0;
    auto next = [&] { return (i = (i * 7919 + 13) % rows); };
    Stats s_raw_r{}, s_direct_r{}, s_actor_r{}, s_raw_w{}, s_direct_w{}, s_actor_w{};
    std::vector<double> raw_r, direct_r, actor_r, raw_w, direct_w, actor_w;
    for (int b = 0; b < 10; ++b) {  // interleaved blocks
      auto block = [&](std::vector<double>& v, auto&& f) {
        for (int k = 0; k < 1000; ++k) {
          auto t0 = clk::now();
          f();
          v.push_back(us_since(t0));
        }
      };
      block(raw_r, [&] { buf.index({next()}); });
      block(direct_r, [&] { store.get({next()}); });
      block(actor_r, [&] { store.read({next()}); });
      block(raw_w, [&] { buf.index_put_({next()}, row); });
      block(direct_w, [&] { store.set_({next()}, row); });
      block(actor_w, [&] { store.write({next()}, row); });
    }
    s_raw_r = stats(raw_r), s_direct_r = stats(direct_r), s_actor_r = stats(actor_r);
    s_raw_w = stats(raw_w), s_direct_w = stats(direct_w), s_actor_w = stats(actor_w);
    int64_t n_keys = 0;
    Stats add = time_each(50, [&] { store.add_key("k" + std::to_string(n_keys++), at::zeros({rows})); });
    store.close();
    fs::remove_all(dir);
    std::snprintf(buf_text, sizeof buf_text,
                  "  ,\"store_rows\": {\"read_raw_td_index_us\": %.2f, \"read_store_get_us\": %.2f, "
                  "\"read_through_actor_us\": %.2f, \"write_raw_index_put_us\": %.2f, \"write_store_set_us\": %.2f, "
                  "\"write_through_actor_us\": %.2f, \"get_vs_raw\": %.2f, \"set_vs_raw\": %.2f, "
                  "\"actor_hop_read_vs_get\": %.2f, \"add_key_median_us\": %.1f}\n",
                  s_raw_r.median_us, s_direct_r.median_us, s_actor_r.median_us, s_raw_w.median_us, s_direct_w.median_us,
                  s_actor_w.median_us, s_direct_r.median_us / s_raw_r.median_us,
                  s_direct_w.median_us / s_raw_w.median_us, s_actor_r.median_us / s_direct_r.median_us, add.median_us);
    out += buf_text;
  }
  // ---- scheduler policies (config scheduler.policy / spin_polls), each on an Engine of its own
  {
    Config sharing = Config::load();
    sharing.scheduler_policy = "sharing";
    Config steal100 = sharing, steal1000 = sharing;
    steal100.scheduler_policy = steal1000.scheduler_policy = "stealing";
    steal100.scheduler_spin_polls = 100;
    steal1000.scheduler_spin_polls = 1000;
    out += "  ,\"scheduler_policies\": {\n" + policy_figures("sharing", sharing) + ",\n" +
           policy_figures("stealing_spin_polls_100", steal100) + ",\n" +
           policy_figures("stealing_spin_polls_1000", steal1000) + "\n  }\n";
  }
  out += "}\n";
  std::fputs(out.c_str(), stdout);
  return 0;
}
