// Places completed device events on a host timeline (the profiling trace's clock): an origin
// event is recorded on an idle stream and waited for; later events are origin + their elapsed
// time. The origin's host time is read after the wait, so that device work never appears to
// start before the host enqueued it (reading it before would place every device span early by
// however long the stream took to reach the origin). Read after, it is late by however long the
// host took to notice (a preempted thread: milliseconds on a loaded machine), so the calibration
// is repeated and the earliest estimate kept: each is late by its own delay, never early. The
// repeats poll the event (yielding) rather than block on it: a blocking wait's wake-up makes
// every sample late by about the same scheduler delay, which no minimum removes. The
// trainer and the offload engine keep a clock each; without this their spans could disagree
// with the order the streams ran them in.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <thread>

#include "device/device.h"

namespace zo::dev {

class EventClock {
 public:
  EventClock() = default;
  // Blocks until `s` is idle and the origin event on it completes; now_us() (the host timeline's
  // clock) gives the time it maps to.
  EventClock(Device& device, Stream& s, const std::function<double()>& now_us)
      : origin_(device.create_event()) {
    s.synchronize();
    device.record(*origin_, s);
    origin_->synchronize();
    origin_us_ = now_us();
    const auto again = device.create_event();
    for (int i = 0; i < kCalibrations; ++i) {
      device.record(*again, s);
      while (!again->query())
        std::this_thread::yield();
      const double t = now_us();
      origin_us_ = std::min(origin_us_, t - 1000.0 * again->elapsed_ms_since(*origin_));
    }
  }
  // Microseconds on the host timeline at which `e` (completed) completed.
  double us(Event& e) const { return origin_us_ + 1000.0 * e.elapsed_ms_since(*origin_); }

 private:
  static constexpr int kCalibrations = 8;
  std::unique_ptr<Event> origin_;
  double origin_us_ = 0.0;
};

}  // namespace zo::dev
