// Profiling trace: spans, instants and counters buffered in memory and written as Chrome
// trace-event JSON (the "JSON Object Format", https://docs.google.com/document/d/
// 1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU), which opens in https://ui.perfetto.dev and
// chrome://tracing. NVTX ranges with the same names mark the same work for Nsight Systems.
#pragma once

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace zo::report {

using TraceClock = std::chrono::steady_clock;

// One process (pid 1) with one track per named track: tid 1, 2, ... in order of first use, named
// by "thread_name" metadata and ordered by "thread_sort_index", so tracks appear in first-use
// order. Times are microseconds since the origin (construction time), written with nanosecond
// resolution. All recording calls are thread-safe. Spans on one track should nest or be disjoint
// (the viewers draw one stack per track). Events with non-finite times or values are ignored.
class Trace {
 public:
  Trace() = default;  // disabled: every call is a cheap no-op and write() writes nothing
  // `run_id` (the training run's) goes into "otherData", so that a resumed run can tell its own
  // trace file from another run's (trace_of_run).
  explicit Trace(std::filesystem::path path, std::size_t max_events = 1'000'000,
                 std::string run_id = {});
  Trace(Trace&&) noexcept = default;  // the moved-from trace is disabled
  Trace& operator=(Trace&&) noexcept = default;
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;

  bool enabled() const { return state_ != nullptr; }
  const std::filesystem::path& path() const;     // empty when disabled
  TraceClock::time_point origin() const;         // the epoch when disabled
  double now_us() const;                         // since origin; 0 when disabled
  double to_us(TraceClock::time_point t) const;  // since origin; 0 when disabled

  // A complete span ("ph":"X") on `track`. A JSON object in `args` becomes the event's "args"
  // (another non-null value becomes {"value": args}). end_us < begin_us gives a zero duration.
  void span(std::string_view track, std::string_view name, double begin_us, double end_us,
            nlohmann::json args = {});
  // A thread-scoped instant event ("ph":"i") on `track`.
  void instant(std::string_view track, std::string_view name, double t_us,
               nlohmann::json args = {});
  // A counter track ("ph":"C", args {"value": value}), e.g. loss scale or bytes in flight.
  void counter(std::string_view name, double t_us, double value);

  // Events kept so far (spans, instants, counters; not metadata). Beyond max_events further
  // events are dropped and counted; write() records the count as "otherData.dropped_events".
  std::size_t event_count() const;
  std::size_t dropped() const;

  // Writes everything recorded so far (may be called again later; each call rewrites the whole
  // file). Atomic: the JSON goes to a temporary file in the same directory, which is fsynced and
  // renamed over `path`, so readers see the old file or the new one, never a partial one. Throws
  // std::runtime_error naming the path and the OS error. Recording threads are blocked only
  // while the events are listed, not while the file is written.
  void write() const;

 private:
  struct State;  // behind a pointer: cheap moves and a mutex that never moves
  struct StateDeleter {
    void operator()(State* s) const noexcept;  // State is complete only in trace.cpp
  };
  std::unique_ptr<State, StateDeleter> state_;
};

// Whether the trace file at `path` was written for run `run_id` (its "otherData.run_id", read from
// the file's first KiB); false for a missing or unreadable file.
bool trace_of_run(const std::filesystem::path& path, const std::string& run_id);

// An NVTX push/pop range on the calling thread (nvtx3, header-only, from the CUDA toolkit) in CUDA
// builds; a no-op otherwise. Without a tool attached (nsys, ncu) a push costs a few nanoseconds.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name) noexcept;
  ~NvtxRange();
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

// RAII: an NVTX range named `name` plus, when `trace` is non-null and enabled, a span on `track`
// from construction to destruction (or to end()). Must end on the thread that created it (NVTX
// ranges are per thread).
class ScopedSpan {
 public:
  ScopedSpan(Trace* trace, std::string_view track, std::string name, nlohmann::json args = {});
  ScopedSpan(const ScopedSpan&) = delete;
  ScopedSpan& operator=(const ScopedSpan&) = delete;
  void end() noexcept;  // closes early; idempotent
  ~ScopedSpan();        // never throws

 private:
  Trace* trace_ = nullptr;  // null when not recording a span
  std::string track_;
  std::string name_;
  nlohmann::json args_;
  double begin_us_ = 0.0;
  bool open_ = true;
};

}  // namespace zo::report
