// Backend-independent parts of the device interface: Buffer, the shared argument checks and
// the default of capture.
#include <stdexcept>
#include <string>
#include <utility>

#include "device/device.h"

namespace zo::dev {
Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    device_ = std::exchange(o.device_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void Buffer::reset() noexcept {
  if (device_ != nullptr && data_ != nullptr) device_->release(data_, bytes_);
  device_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

void synchronize_quietly(Stream& s) noexcept {
  try {
    s.synchronize();
  } catch (const std::exception&) {
  }
}

void check_adamw_args(const char* op, const AdamConfig& c, std::int64_t t, float grad_mult) {
  c.validate(op);
  check_adam_step(op, t, grad_mult);
  if (!c.decoupled_weight_decay) {
    throw std::invalid_argument(std::string(op) +
                                ": only AdamW (decoupled weight decay) runs on a device; use "
                                "cpu_adam for L2-style Adam");
  }
}

std::unique_ptr<Graph> Device::capture(Stream&, const std::function<void()>&) {
  throw std::logic_error(name() + " cannot record graphs (check can_capture first)");
}

}  // namespace zo::dev
