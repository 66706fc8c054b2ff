// Backend-independent parts of the device interface: the out-of-memory error and Buffer.
#include <cstdio>
#include <string>
#include <utility>

#include "device/device.h"

namespace zo::dev {
namespace {

std::string human_bytes(std::size_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024.0 && unit < 5) {
    v /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.2f %s", v, kUnits[unit]);
  return text;
}

std::string oom_message(const std::string& what, std::size_t requested, std::size_t in_use,
                        std::size_t capacity) {
  std::string m = "out of device memory allocating " + what + ": requested " +
                  human_bytes(requested) + " (" + std::to_string(requested) + " bytes) with " +
                  human_bytes(in_use) + " in use";
  if (capacity != 0) {
    m += " of " + human_bytes(capacity) + " capacity (" +
         human_bytes(in_use < capacity ? capacity - in_use : 0) + " free)";
  } else {
    m += " (no capacity limit set: the host ran out of memory)";
  }
  return m + "; use a smaller --micro-batch, enable --recompute, or raise --device-memory";
}

}  // namespace

OutOfMemoryError::OutOfMemoryError(const std::string& what, std::size_t requested,
                                   std::size_t in_use, std::size_t capacity)
    : std::runtime_error(oom_message(what, requested, in_use, capacity)),
      requested_(requested),
      in_use_(in_use),
      capacity_(capacity) {}

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

}  // namespace zo::dev
