#include "device/host_stream.h"

#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

namespace zo::dev {

// ---- events ----------------------------------------------------------------------------------

std::uint64_t HostEventState::begin_record() {
  std::lock_guard lock(mu_);
  return ++recorded_;
}

void HostEventState::complete(std::uint64_t gen) {
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(mu_);
    // Recordings on one stream complete in order; across streams the latest generation wins.
    if (gen > completed_) {
      completed_ = gen;
      stamp_ = now;
    }
  }
  cv_.notify_all();
}

void HostEventState::wait_for(std::uint64_t gen) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return completed_ >= gen; });
}

std::uint64_t HostEventState::recorded() {
  std::lock_guard lock(mu_);
  return recorded_;
}

bool HostEventState::done() {
  std::lock_guard lock(mu_);
  return completed_ >= recorded_;
}

std::chrono::steady_clock::time_point HostEventState::completion_time(const char* which) {
  std::lock_guard lock(mu_);
  if (recorded_ == 0 || completed_ < recorded_) {
    throw std::logic_error(
        std::string("Event::elapsed_ms_since: the ") + which +
        (recorded_ == 0 ? " event was never recorded" : " event has not completed yet") +
        "; record both events and synchronize() on the later one first");
  }
  return stamp_;
}

double HostEvent::elapsed_ms_since(Event& start) {
  auto* s = dynamic_cast<HostEvent*>(&start);
  if (s == nullptr) {
    throw std::invalid_argument(
        "Event::elapsed_ms_since: the start event belongs to another backend; both events must "
        "come from the same host device");
  }
  const auto t0 = s->state_->completion_time("start");
  const auto t1 = state_->completion_time("end");
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

// ---- streams ---------------------------------------------------------------------------------

HostStream::HostStream() : worker_([this] { worker_loop(); }) {}

HostStream::~HostStream() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  has_work_.notify_all();
  try {
    if (worker_.joinable()) worker_.join();
  } catch (...) {  // join only throws for a worker that cannot be joined; nothing left to do
  }
  if (error_) {
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "warning: host stream destroyed with an unreported error: %s\n",
                   e.what());
    } catch (...) {
      std::fprintf(stderr, "warning: host stream destroyed with an unreported error\n");
    }
  }
}

void HostStream::enqueue(std::function<void()> task, bool always_run) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(Task{std::move(task), always_run});
  }
  has_work_.notify_one();
}

void HostStream::synchronize() {
  std::unique_lock lock(mu_);
  drained_.wait(lock, [&] { return queue_.empty() && !running_; });
  if (error_) {
    std::exception_ptr e = std::exchange(error_, nullptr);
    lock.unlock();
    std::rethrow_exception(e);
  }
}

void HostStream::worker_loop() {
  for (;;) {
    Task task;
    bool skip = false;
    {
      std::unique_lock lock(mu_);
      has_work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      skip = error_ != nullptr && !task.always_run;
      running_ = true;
    }
    if (!skip) {
      try {
        task.fn();
      } catch (...) {
        std::lock_guard lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
    task.fn = nullptr;  // release captured state before reporting the task finished
    {
      std::lock_guard lock(mu_);
      running_ = false;
      if (queue_.empty()) drained_.notify_all();
    }
  }
}

}  // namespace zo::dev
