// Places completed device events on a host timeline (the profiling trace's clock): an origin
// event is recorded on an idle stream and waited for once; later events are origin + their
// elapsed time. The origin's host time is read after the wait, so that device work never appears
// to start before the host enqueued it (reading it before would place every device span early by
// however long the stream took to reach the origin).
#pragma once

#include <functional>
#include <memory>

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
  }
  // Microseconds on the host timeline at which `e` (completed) completed.
  double us(Event& e) const { return origin_us_ + 1000.0 * e.elapsed_ms_since(*origin_); }

 private:
  std::unique_ptr<Event> origin_;
  double origin_us_ = 0.0;
};

}  // namespace zo::dev
