// Tests for src/report/trace: Chrome trace-event JSON from many threads (spans, tracks and their
// metadata, instants, counters), the event limit, atomic rewrites, errors, and ScopedSpan timing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "report/trace.h"

namespace zo::report {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Written times are rounded to the nanosecond; a span's duration is rounded twice.
constexpr double kTimeTol = 1.001e-3;

// A unique temporary directory, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("zo_test_report_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(counter++) + "_" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  fs::path file(const std::string& name) const { return path_ / name; }
  const fs::path& path() const { return path_; }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(path_))
      names.push_back(e.path().filename().string());
    return names;
  }

 private:
  fs::path path_;
};

unsigned fresh_seed() {
  return std::random_device{}();
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

// A written trace split into its parts, with the metadata checked for consistency.
struct Parsed {
  std::map<int, std::string> track_of;  // tid -> thread_name
  std::vector<json> events;             // everything but metadata, in file order
  json other;
};

Parsed parse_trace(const fs::path& path) {
  const json doc = read_json(path);
  Parsed p;
  EXPECT_TRUE(doc.at("traceEvents").is_array());
  p.other = doc.at("otherData");
  std::map<int, int> sort_index;
  for (const json& e : doc.at("traceEvents")) {
    EXPECT_EQ(e.at("pid"), 1);
    if (e.at("ph") != "M") {
      p.events.push_back(e);
      continue;
    }
    const std::string what = e.at("name");
    if (what == "thread_name") {
      EXPECT_TRUE(p.track_of.emplace(e.at("tid").get<int>(), e.at("args").at("name")).second);
    } else if (what == "thread_sort_index") {
      sort_index[e.at("tid").get<int>()] = e.at("args").at("sort_index").get<int>();
    } else {
      EXPECT_EQ(what, "process_name");
    }
  }
  // tids 1..K, each named once with a distinct name, sorted in tid (first-use) order.
  std::set<std::string> names;
  int expected_tid = 1;
  for (const auto& [tid, name] : p.track_of) {
    EXPECT_EQ(tid, expected_tid++);
    EXPECT_TRUE(names.insert(name).second) << "track named twice: " << name;
    EXPECT_EQ(sort_index[tid], tid);
  }
  EXPECT_EQ(sort_index.size(), p.track_of.size());
  return p;
}

// Names with the characters JSON must escape, and some UTF-8.
std::string random_name(std::mt19937& rng) {
  static const std::vector<std::string> pieces = {
      "bucket", "copy",     "adam",         "h2d", "d2h", " ", "\"", "\\", "/",
      "\t",     "\xC3\xA9", "\xE2\x86\x92", "0",   "7",   "_", "{",  "}",  "\n"};
  std::uniform_int_distribution<std::size_t> len(1, 8), pick(0, pieces.size() - 1);
  std::string s;
  for (std::size_t n = len(rng); n > 0; --n)
    s += pieces[pick(rng)];
  return s;
}

const std::vector<std::string> kTracks = {"compute", "d2h",  "h2d",
                                          "adam",    "main", "odd \"track\" \\ \xC3\xA9"};

struct Expected {
  std::string track, name;
  double begin = 0.0, end = 0.0;
  json args;
};

TEST(Trace, SpansFromManyThreadsAllArriveOnTheirTracks) {
  const unsigned seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  TempDir dir;
  Trace trace(dir.file("trace.json"));
  ASSERT_TRUE(trace.enabled());
  EXPECT_EQ(trace.path(), dir.file("trace.json"));

  constexpr int kThreads = 8;
  std::vector<std::vector<Expected>> expected(kThreads);
  std::vector<std::size_t> n_other(kThreads, 0);
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(seed + static_cast<unsigned>(t));
      std::uniform_int_distribution<int> count(20, 400), track(0, int(kTracks.size()) - 1),
          other(0, 9);
      std::uniform_real_distribution<double> begin(0.0, 5e6), dur(0.0, 2e4);
      std::uniform_int_distribution<long long> bytes(1, 1LL << 40);
      const int n = count(rng);
      while (!go.load())
        std::this_thread::yield();
      for (int i = 0; i < n; ++i) {
        Expected e{kTracks[std::size_t(track(rng))], random_name(rng), begin(rng), 0.0,
                   json{{"thread", t}, {"i", i}, {"bytes", bytes(rng)}}};
        e.end = e.begin + dur(rng);
        trace.span(e.track, e.name, e.begin, e.end, e.args);
        expected[std::size_t(t)].push_back(std::move(e));
        if (other(rng) == 0) {  // interleave the other kinds of event
          trace.counter("bytes in flight", begin(rng), double(bytes(rng)));
          trace.instant("main", "mark", begin(rng));
          n_other[std::size_t(t)] += 2;
        }
      }
    });
  }
  go = true;
  for (auto& th : threads)
    th.join();

  std::size_t n_spans = 0, n_total = 0;
  std::set<std::string> used_tracks;
  for (int t = 0; t < kThreads; ++t) {
    n_spans += expected[std::size_t(t)].size();
    n_total += expected[std::size_t(t)].size() + n_other[std::size_t(t)];
    for (const Expected& e : expected[std::size_t(t)])
      used_tracks.insert(e.track);
    if (n_other[std::size_t(t)] > 0) used_tracks.insert("main");
  }
  EXPECT_EQ(trace.event_count(), n_total);
  EXPECT_EQ(trace.dropped(), 0u);
  trace.write();

  const Parsed p = parse_trace(dir.file("trace.json"));
  EXPECT_EQ(p.other.at("dropped_events"), 0);
  std::set<std::string> named;
  for (const auto& [tid, name] : p.track_of)
    named.insert(name);
  EXPECT_EQ(named, used_tracks);
  ASSERT_EQ(p.events.size(), n_total);

  std::set<std::pair<int, int>> seen;
  double last_ts = -1.0;
  for (const json& ev : p.events) {
    const double ts = ev.at("ts");
    EXPECT_GE(ts, 0.0);
    EXPECT_GE(ts, last_ts) << "events are written in time order";
    last_ts = ts;
    if (ev.at("ph") != "X") continue;
    const int t = ev.at("args").at("thread"), i = ev.at("args").at("i");
    ASSERT_TRUE(t >= 0 && t < kThreads && i >= 0 && i < int(expected[std::size_t(t)].size()));
    EXPECT_TRUE(seen.emplace(t, i).second) << "span written twice";
    const Expected& e = expected[std::size_t(t)][std::size_t(i)];
    EXPECT_EQ(p.track_of.at(ev.at("tid").get<int>()), e.track);
    EXPECT_EQ(ev.at("name"), e.name);
    EXPECT_NEAR(ts, e.begin, kTimeTol);
    EXPECT_NEAR(ev.at("dur").get<double>(), e.end - e.begin, kTimeTol);
    EXPECT_EQ(ev.at("args"), e.args);
  }
  EXPECT_EQ(seen.size(), n_spans);
}

TEST(Trace, TracksAreNumberedInFirstUseOrder) {
  const unsigned seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  TempDir dir;
  Trace trace(dir.file("t.json"));
  std::vector<std::string> pool = kTracks;
  std::shuffle(pool.begin(), pool.end(), rng);
  std::vector<std::string> first_use;
  std::uniform_int_distribution<std::size_t> pick(0, pool.size() - 1);
  std::uniform_real_distribution<double> time(0.0, 1e5);
  for (int i = 0; i < 200; ++i) {
    const std::string& track = pool[pick(rng)];
    if (std::find(first_use.begin(), first_use.end(), track) == first_use.end())
      first_use.push_back(track);
    const double b = time(rng);
    trace.span(track, random_name(rng), b, b + time(rng));
  }
  trace.write();
  const Parsed p = parse_trace(dir.file("t.json"));
  ASSERT_EQ(p.track_of.size(), first_use.size());
  for (std::size_t i = 0; i < first_use.size(); ++i)
    EXPECT_EQ(p.track_of.at(int(i) + 1), first_use[i]);
  for (const json& ev : p.events)
    EXPECT_FALSE(ev.contains("args")) << "a span without args has no args object";
}

TEST(Trace, InstantsAndCounters) {
  const unsigned seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> time(0.0, 1e7), value(-1e9, 1e9);
  TempDir dir;
  Trace trace(dir.file("t.json"));
  const double t_instant = time(rng), t_counter = time(rng), v = value(rng);
  const int arg = std::uniform_int_distribution<int>(1, 1000000)(rng);
  trace.instant("adam", "step done", t_instant, json{{"step", arg}});
  trace.counter("loss scale", t_counter, v);
  trace.span("main", "scalar args", 1.0, 2.0, json(arg));  // a non-object is wrapped
  trace.counter("loss scale", 1.0, std::nan(""));          // non-finite: ignored
  trace.span("main", "never", 1.0, std::numeric_limits<double>::infinity());
  EXPECT_EQ(trace.event_count(), 3u);
  trace.write();

  const Parsed p = parse_trace(dir.file("t.json"));
  ASSERT_EQ(p.events.size(), 3u);
  int found = 0;
  for (const json& ev : p.events) {
    if (ev.at("ph") == "i") {
      ++found;
      EXPECT_EQ(ev.at("s"), "t");
      EXPECT_EQ(p.track_of.at(ev.at("tid").get<int>()), "adam");
      EXPECT_EQ(ev.at("name"), "step done");
      EXPECT_NEAR(ev.at("ts").get<double>(), t_instant, kTimeTol);
      EXPECT_EQ(ev.at("args"), (json{{"step", arg}}));
    } else if (ev.at("ph") == "C") {
      ++found;
      EXPECT_EQ(ev.at("name"), "loss scale");
      EXPECT_NEAR(ev.at("ts").get<double>(), t_counter, kTimeTol);
      EXPECT_EQ(ev.at("args").at("value").get<double>(), v);  // shortest round trip: exact
    } else {
      ++found;
      EXPECT_EQ(ev.at("ph"), "X");
      EXPECT_EQ(ev.at("args"), (json{{"value", arg}}));
    }
  }
  EXPECT_EQ(found, 3);
}

TEST(Trace, DropsEventsBeyondTheLimitAndCountsThem) {
  const unsigned seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const std::size_t max_events = std::uniform_int_distribution<std::size_t>(5, 40)(rng);
  const std::size_t n = max_events + std::uniform_int_distribution<std::size_t>(1, 100)(rng);
  std::uniform_real_distribution<double> time(0.0, 1e6);
  TempDir dir;
  Trace trace(dir.file("t.json"), max_events);
  for (std::size_t i = 0; i < n; ++i) {
    const double b = time(rng);
    switch (i % 3) {
      case 0:
        trace.span("compute", "span " + std::to_string(i), b, b + time(rng));
        break;
      case 1:
        trace.instant("main", "instant " + std::to_string(i), b);
        break;
      default:
        trace.counter("counter " + std::to_string(i), b, time(rng));
        break;
    }
  }
  EXPECT_EQ(trace.event_count(), max_events);
  EXPECT_EQ(trace.dropped(), n - max_events);
  trace.write();
  const Parsed p = parse_trace(dir.file("t.json"));
  EXPECT_EQ(p.other.at("dropped_events").get<std::size_t>(), n - max_events);
  ASSERT_EQ(p.events.size(), max_events);
  std::set<std::size_t> kept;  // the first max_events are kept
  for (const json& ev : p.events) {
    const std::string name = ev.at("name");
    kept.insert(std::stoul(name.substr(name.find(' ') + 1)));
  }
  ASSERT_EQ(kept.size(), max_events);
  EXPECT_EQ(*kept.begin(), 0u);
  EXPECT_EQ(*kept.rbegin(), max_events - 1);
}

TEST(Trace, DisabledTraceRecordsAndWritesNothing) {
  TempDir dir;
  Trace off;
  EXPECT_FALSE(off.enabled());
  EXPECT_TRUE(off.path().empty());
  EXPECT_EQ(off.now_us(), 0.0);
  off.span("main", "x", 1.0, 2.0, json{{"a", 1}});
  off.instant("main", "x", 1.0);
  off.counter("c", 1.0, 2.0);
  EXPECT_EQ(off.event_count(), 0u);
  EXPECT_EQ(off.dropped(), 0u);
  EXPECT_NO_THROW(off.write());
  { ScopedSpan s(&off, "main", "disabled"); }
  { ScopedSpan s(nullptr, "main", "no trace"); }

  // A moved-from trace is disabled too; the moved-to one owns the events and the file.
  Trace on(dir.file("t.json"));
  on.span("main", "kept", 1.0, 2.0);
  Trace moved(std::move(on));
  EXPECT_FALSE(on.enabled());  // NOLINT(bugprone-use-after-move): documented state
  on.write();
  EXPECT_TRUE(dir.entries().empty());
  Trace assigned;
  assigned = std::move(moved);
  EXPECT_EQ(assigned.event_count(), 1u);
  assigned.write();
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"t.json"});
}

TEST(Trace, WriteIntoAMissingDirectoryThrowsNamingThePath) {
  TempDir dir;
  const fs::path path = dir.file("no_such_dir") / "trace.json";
  Trace trace(path);
  trace.span("main", "x", 1.0, 2.0);
  try {
    trace.write();
    FAIL() << "write() into a missing directory succeeded";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path.string()), std::string::npos) << what;
    EXPECT_NE(what.find("No such file or directory"), std::string::npos) << what;
  }
  EXPECT_TRUE(dir.entries().empty());
}

TEST(Trace, RewritesAtomically) {
  const unsigned seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  TempDir dir;
  const fs::path path = dir.file("trace.json");
  {  // a longer file already there is replaced, not overwritten in place
    std::ofstream old(path);
    old << json{{"old", std::vector<int>(200000, 7)}}.dump();
  }
  Trace trace(path);
  std::atomic<bool> done{false};
  int reads = 0;
  std::thread reader([&] {
    std::size_t last_count = 0;
    bool last = false;
    do {
      last = done.load();
      std::ifstream in(path);
      json doc = json::parse(in, nullptr, /*allow_exceptions=*/false);
      ++reads;
      if (doc.is_discarded()) {
        ADD_FAILURE() << "a reader saw a partial file";
        return;
      }
      if (doc.contains("traceEvents")) {
        const std::size_t count = doc["traceEvents"].size();
        EXPECT_GE(count, last_count);
        last_count = count;
      }
    } while (!last);
  });
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> time(0.0, 1e6);
  std::size_t n = 0;
  for (int round = 0; round < 20; ++round) {
    const int k = std::uniform_int_distribution<int>(100, 2000)(rng);
    for (int i = 0; i < k; ++i, ++n) {
      const double b = time(rng);
      trace.span("d2h", random_name(rng), b, b + time(rng));
    }
    trace.write();
  }
  done = true;
  reader.join();
  EXPECT_GE(reads, 1);

  const Parsed p = parse_trace(path);
  EXPECT_EQ(p.events.size(), n);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"trace.json"}) << "temporary files left";
}

TEST(Trace, ClockConversions) {
  Trace trace("unused.json");
  EXPECT_EQ(trace.to_us(trace.origin()), 0.0);
  EXPECT_DOUBLE_EQ(trace.to_us(trace.origin() + std::chrono::microseconds(1500)), 1500.0);
  const double a = trace.now_us();
  const double b = trace.now_us();
  EXPECT_GE(a, 0.0);
  EXPECT_GE(b, a);
}

TEST(ScopedSpan, CoversItsLifetime) {
  const unsigned seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int sleep_us = std::uniform_int_distribution<int>(2000, 20000)(rng);
  const int step = std::uniform_int_distribution<int>(1, 1 << 30)(rng);
  TempDir dir;
  Trace trace(dir.file("t.json"));
  const double outer_begin = trace.now_us();
  {
    ScopedSpan span(&trace, "adam", "adam piece", json{{"step", step}});
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
  }
  const double outer_end = trace.now_us();
  ASSERT_EQ(trace.event_count(), 1u);
  trace.write();
  const Parsed p = parse_trace(dir.file("t.json"));
  ASSERT_EQ(p.events.size(), 1u);
  const json& ev = p.events[0];
  EXPECT_EQ(ev.at("ph"), "X");
  EXPECT_EQ(ev.at("name"), "adam piece");
  EXPECT_EQ(p.track_of.at(ev.at("tid").get<int>()), "adam");
  EXPECT_EQ(ev.at("args"), (json{{"step", step}}));
  const double ts = ev.at("ts"), dur = ev.at("dur");
  EXPECT_GE(ts, outer_begin - kTimeTol);
  EXPECT_GE(dur, sleep_us - kTimeTol);
  EXPECT_LE(ts + dur, outer_end + 2 * kTimeTol);
  EXPECT_LE(dur, sleep_us + 2e6);  // generous: a loaded machine may deschedule us
}

TEST(ScopedSpan, EndClosesEarlyAndIsIdempotent) {
  const unsigned seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> sleep_us(1000, 5000);
  TempDir dir;
  Trace trace(dir.file("t.json"));
  const int first = sleep_us(rng);
  double ended = 0.0;
  {
    ScopedSpan span(&trace, "h2d", "upload");
    std::this_thread::sleep_for(std::chrono::microseconds(first));
    span.end();
    ended = trace.now_us();
    span.end();
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us(rng)));
  }
  {
    ScopedSpan untraced(nullptr, "h2d", "untraced");
    untraced.end();
    untraced.end();
  }
  { NvtxRange range("nvtx only"); }
  ASSERT_EQ(trace.event_count(), 1u);
  trace.write();
  const Parsed p = parse_trace(dir.file("t.json"));
  ASSERT_EQ(p.events.size(), 1u);
  const double ts = p.events[0].at("ts"), dur = p.events[0].at("dur");
  EXPECT_GE(dur, first - kTimeTol);
  EXPECT_LE(ts + dur, ended + 2 * kTimeTol) << "the span ended at end(), not at destruction";
}

}  // namespace
}  // namespace zo::report
