// Places completed device events on a host timeline (the profiling trace's clock): an origin
// event is recorded and waited for once; later events are origin + their elapsed time.
#pragma once

#include <memory>

#include "device/device.h"

namespace zo::dev {

class EventClock {
 public:
  EventClock() = default;
  // Blocks until the origin event on `s` completes; `origin_us` is the host time it maps to.
  EventClock(Device& device, Stream& s, double origin_us) : origin_(device.create_event()) {
    device.record(*origin_, s);
    origin_->synchronize();
    origin_us_ = origin_us;
  }
  // Microseconds on the host timeline at which `e` (completed) completed.
  double us(Event& e) const { return origin_us_ + 1000.0 * e.elapsed_ms_since(*origin_); }

 private:
  std::unique_ptr<Event> origin_;
  double origin_us_ = 0.0;
};

}  // namespace zo::dev
