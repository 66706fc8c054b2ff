#include "device/host_stream.h"

#include <stdexcept>
#include <string>

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

}  // namespace zo::dev
