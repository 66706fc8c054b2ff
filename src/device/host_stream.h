// Host-backend streams and events: each stream is a worker thread draining a FIFO of tasks (a
// zo::SerialQueue), and an event completes when a marker task runs, so stream ordering and
// overlap are real on the host and ThreadSanitizer sees the happens-before edges the CUDA backend
// relies on.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

#include "core/serial_queue.h"
#include "device/device.h"

namespace zo::dev {

// Shared by a HostEvent and every marker / wait task that refers to it, so an event can be
// destroyed while work that mentions it is still queued.
class HostEventState {
 public:
  // Starts a new recording; returns its generation (1, 2, ...). Re-recording is allowed.
  std::uint64_t begin_record();
  // Runs on the stream when the marker of generation `gen` is reached.
  void complete(std::uint64_t gen);
  // Blocks until generation `gen` has completed (returns at once for gen 0: never recorded).
  void wait_for(std::uint64_t gen);
  std::uint64_t recorded();
  bool done();
  // Completion time of the latest recording; throws std::logic_error if it has not completed.
  std::chrono::steady_clock::time_point completion_time(const char* which);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t recorded_ = 0;                   // generation of the latest record()
  std::uint64_t completed_ = 0;                  // latest generation whose marker has run
  std::chrono::steady_clock::time_point stamp_;  // when that marker ran
};

class HostEvent final : public Event {
 public:
  HostEvent() : state_(std::make_shared<HostEventState>()) {}
  void synchronize() override { state_->wait_for(state_->recorded()); }
  bool query() override { return state_->done(); }
  double elapsed_ms_since(Event& start) override;
  const std::shared_ptr<HostEventState>& state() const { return state_; }

 private:
  std::shared_ptr<HostEventState> state_;
};

class HostStream final : public Stream {
 public:
  HostStream() : queue_("host stream") {}

  // Appends a task; tasks run one at a time in FIFO order on this stream's worker thread.
  // After a task throws, later tasks are skipped until synchronize() reports the error (like a
  // sticky CUDA error), except `always_run` tasks: event markers still complete, so streams that
  // wait on this one's events never hang. Destroying the stream drains it; an error nobody
  // synchronized on is printed, not thrown.
  void enqueue(std::function<void()> task, bool always_run = false) {
    queue_.post(std::move(task), always_run);
  }
  // Blocks until the queue is drained; rethrows (once) the first exception a task raised since
  // the previous synchronize(). The stream is usable again afterwards.
  void synchronize() override { queue_.wait_idle(); }

 private:
  SerialQueue queue_;
};

}  // namespace zo::dev
