#include "report/trace.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <stdexcept>
#include <system_error>
#include <utility>
#include <vector>

#if defined(ZO_HAVE_CUDA)
#include <nvtx3/nvToolsExt.h>
#endif

namespace zo::report {
namespace fs = std::filesystem;

namespace {

struct Event {
  char ph = 'X';     // 'X' complete span, 'i' instant, 'C' counter
  int tid = 0;       // track; 0 for counters (process-wide)
  double ts = 0.0;   // us since origin, rounded to ns
  double dur = 0.0;  // 'X': us; 'C': the counter value
  std::string name;
  std::string args;  // the arguments' JSON object, serialised when recorded; empty: none
};

// Nanosecond resolution keeps the file short ("1234.567" instead of 17 digits) and is what the
// viewers keep anyway. Rounding is monotone, so nested spans stay nested.
double round_ns(double us) {
  return std::round(us * 1000.0) / 1000.0;
}

void append_number(std::string& out, double v) {
  char buf[64];
  // Fixed notation, shortest round trip: no exponents for long runs' timestamps.
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed);
  out.append(buf, r.ec == std::errc() ? r.ptr : buf);
}

void append_json(std::string& out, const nlohmann::json& j) {
  // Invalid UTF-8 in a name or argument becomes U+FFFD instead of failing the whole write.
  out += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// An event's arguments as the text of a JSON object (a value that is not one as {"value": v}),
// kept instead of the parsed tree, which took several allocations per event.
std::string args_text(nlohmann::json args) {
  std::string out;
  if (args.is_null()) return out;
  append_json(out, args.is_object() ? args : nlohmann::json{{"value", std::move(args)}});
  return out;
}

void append_event(std::string& out, const Event& e) {
  out += "{\"ph\":\"";
  out += e.ph;
  out += "\",\"pid\":1";
  if (e.ph != 'C') {
    out += ",\"tid\":";
    out += std::to_string(e.tid);
  }
  out += ",\"ts\":";
  append_number(out, e.ts);
  if (e.ph == 'X') {
    out += ",\"dur\":";
    append_number(out, e.dur);
  } else if (e.ph == 'i') {
    out += ",\"s\":\"t\"";
  }
  out += ",\"name\":";
  append_json(out, nlohmann::json(e.name));
  if (e.ph == 'C') {
    out += ",\"args\":{\"value\":";
    append_number(out, e.dur);
    out += '}';
  } else if (!e.args.empty()) {
    out += ",\"args\":";
    out += e.args;
  }
  out += '}';
}

std::string errno_text(int err) {
  return std::error_code(err, std::generic_category()).message();
}

// A temporary file next to `target`, renamed over it by commit() and removed otherwise.
class TempFile {
 public:
  explicit TempFile(const fs::path& target) : target_(target) {
    static std::atomic<unsigned> counter{0};
    tmp_ = target.parent_path() / ("." + target.filename().string() + ".tmp." +
                                   std::to_string(::getpid()) + "." + std::to_string(counter++));
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot create a temporary file", errno);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }

  void append(std::string& buf) {
    const char* p = buf.data();
    std::size_t n = buf.size();
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail("write failed (disk full or quota?)", w < 0 ? errno : EIO);
      p += w;
      n -= static_cast<std::size_t>(w);
    }
    buf.clear();
  }

  void commit() {
    if (::fsync(fd_) != 0) fail("fsync failed", errno);
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) fail("close failed", errno);
    if (std::rename(tmp_.c_str(), target_.c_str()) != 0) fail("rename failed", errno);
    committed_ = true;
  }

 private:
  [[noreturn]] void fail(const std::string& what, int err) const {
    throw std::runtime_error("cannot write trace file '" + target_.string() + "': " + what +
                             " (temporary file '" + tmp_.string() + "'): " + errno_text(err) +
                             "; choose a writable --trace path");
  }

  fs::path target_;
  fs::path tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

#if defined(ZO_HAVE_CUDA)
void nvtx_push(const char* name) noexcept {
  nvtxRangePushA(name);
}
void nvtx_pop() noexcept {
  nvtxRangePop();
}
#else
void nvtx_push(const char*) noexcept {}
void nvtx_pop() noexcept {}
#endif

}  // namespace

struct Trace::State {
  fs::path path;
  std::size_t max_events = 0;
  std::string run_id;
  TraceClock::time_point origin;

  mutable std::mutex mu;                         // guards everything below
  std::deque<Event> events;                      // a deque: no bulk moves while a thread waits
  std::map<std::string, int, std::less<>> tids;  // track name -> tid (1-based)
  std::vector<std::string> tracks;               // names by tid - 1
  std::size_t dropped = 0;

  void record(std::string_view track, Event&& e) {
    std::lock_guard lock(mu);
    if (events.size() >= max_events) {
      ++dropped;
      return;
    }
    if (e.ph != 'C') {
      auto it = tids.find(track);
      if (it == tids.end()) {
        it = tids.emplace(std::string(track), static_cast<int>(tracks.size()) + 1).first;
        tracks.emplace_back(track);
      }
      e.tid = it->second;
    }
    events.push_back(std::move(e));
  }
};

void Trace::StateDeleter::operator()(State* s) const noexcept {
  delete s;
}

Trace::Trace(fs::path path, std::size_t max_events, std::string run_id) : state_(new State) {
  state_->path = std::move(path);
  state_->max_events = max_events;
  state_->run_id = std::move(run_id);
  state_->origin = TraceClock::now();
}

const fs::path& Trace::path() const {
  static const fs::path kEmpty;
  return state_ ? state_->path : kEmpty;
}

TraceClock::time_point Trace::origin() const {
  return state_ ? state_->origin : TraceClock::time_point{};
}

double Trace::now_us() const {
  return state_ ? to_us(TraceClock::now()) : 0.0;
}

double Trace::to_us(TraceClock::time_point t) const {
  if (!state_) return 0.0;
  return std::chrono::duration<double, std::micro>(t - state_->origin).count();
}

void Trace::span(std::string_view track, std::string_view name, double begin_us, double end_us,
                 nlohmann::json args) {
  if (!state_ || !std::isfinite(begin_us) || !std::isfinite(end_us)) return;
  Event e;
  e.ph = 'X';
  e.ts = round_ns(begin_us);
  e.dur = std::max(0.0, round_ns(round_ns(end_us) - e.ts));
  e.name.assign(name);
  e.args = args_text(std::move(args));
  state_->record(track, std::move(e));
}

void Trace::instant(std::string_view track, std::string_view name, double t_us,
                    nlohmann::json args) {
  if (!state_ || !std::isfinite(t_us)) return;
  Event e;
  e.ph = 'i';
  e.ts = round_ns(t_us);
  e.name.assign(name);
  e.args = args_text(std::move(args));
  state_->record(track, std::move(e));
}

void Trace::counter(std::string_view name, double t_us, double value) {
  if (!state_ || !std::isfinite(t_us) || !std::isfinite(value)) return;
  Event e;
  e.ph = 'C';
  e.ts = round_ns(t_us);
  e.dur = value;
  e.name.assign(name);
  state_->record({}, std::move(e));
}

std::size_t Trace::event_count() const {
  if (!state_) return 0;
  std::lock_guard lock(state_->mu);
  return state_->events.size();
}

std::size_t Trace::dropped() const {
  if (!state_) return 0;
  std::lock_guard lock(state_->mu);
  return state_->dropped;
}

bool trace_of_run(const fs::path& path, const std::string& run_id) {
  if (run_id.empty()) return false;
  std::ifstream in(path, std::ios::binary);
  std::string head(1024, '\0');
  in.read(head.data(), std::streamsize(head.size()));
  head.resize(std::size_t(in.gcount()));
  return head.find("\"run_id\":" + nlohmann::json(run_id).dump()) != std::string::npos;
}

void Trace::write() const {
  if (!state_) return;
  // Pointers, not copies (a copy doubled the buffer's memory at the end of a run): a deque's
  // push_back moves no element, and recorded events never change.
  std::vector<const Event*> events;
  std::vector<std::string> tracks;
  std::size_t dropped = 0;
  {
    std::lock_guard lock(state_->mu);
    events.reserve(state_->events.size());
    for (const Event& e : state_->events)
      events.push_back(&e);
    tracks = state_->tracks;
    dropped = state_->dropped;
  }
  // Time order, enclosing spans before the spans they contain (older viewers rely on it).
  const auto key = [](const Event* e) { return std::pair(e->ts, e->ph == 'X' ? -e->dur : 0.0); };
  std::stable_sort(events.begin(), events.end(),
                   [&](const Event* a, const Event* b) { return key(a) < key(b); });

  TempFile file(state_->path);
  constexpr std::size_t kFlushBytes = 1u << 20;
  std::string out;
  out.reserve(kFlushBytes + 4096);
  out += "{\"displayTimeUnit\":\"ms\",\"otherData\":";
  append_json(out, nlohmann::json{{"clock", "steady_clock"},
                                  {"max_events", state_->max_events},
                                  {"run_id", state_->run_id},
                                  {"dropped_events", dropped}});
  out += ",\"traceEvents\":[\n";
  out += R"({"ph":"M","pid":1,"name":"process_name","args":{"name":"offload_train"}})";
  for (std::size_t i = 0; i < tracks.size(); ++i) {
    const std::string tid = std::to_string(i + 1);
    out += ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":" + tid + ",\"name\":\"thread_name\",\"args\":";
    append_json(out, nlohmann::json{{"name", tracks[i]}});
    out += "},\n{\"ph\":\"M\",\"pid\":1,\"tid\":" + tid +
           ",\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":" + tid + "}}";
  }
  for (const Event* e : events) {
    out += ",\n";
    append_event(out, *e);
    if (out.size() >= kFlushBytes) file.append(out);
  }
  out += "\n]}\n";
  file.append(out);
  file.commit();
}

NvtxRange::NvtxRange(const char* name) noexcept {
  nvtx_push(name);
}

NvtxRange::~NvtxRange() {
  nvtx_pop();
}

ScopedSpan::ScopedSpan(Trace* trace, std::string_view track, std::string name, nlohmann::json args)
    : name_(std::move(name)) {
  if (trace != nullptr && trace->enabled()) {
    track_.assign(track);
    args_ = std::move(args);
    trace_ = trace;
  }
  nvtx_push(name_.c_str());  // last: nothing below can throw and leave the range open
  if (trace_ != nullptr) begin_us_ = trace_->now_us();
}

void ScopedSpan::end() noexcept {
  if (!open_) return;
  open_ = false;
  const double end_us = trace_ != nullptr ? trace_->now_us() : 0.0;
  nvtx_pop();
  if (trace_ == nullptr) return;
  try {
    trace_->span(track_, name_, begin_us_, end_us, std::move(args_));
  } catch (...) {  // out of memory: lose the span, not the run
  }
}

ScopedSpan::~ScopedSpan() {
  end();
}

}  // namespace zo::report
