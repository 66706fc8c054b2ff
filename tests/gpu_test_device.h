// The GPU a CUDA test runs on: the first usable device, queried once per test binary.
#pragma once

#include "gpu/device.h"

namespace zo::test {

// Index of the first device this build can use, or -1 (zo::gpu::no_device_reason() says why).
inline int usable_device() {
  static const int index = [] {
    for (const zo::gpu::DeviceInfo& info : zo::gpu::query_devices()) {
      if (info.usable()) return info.index;
    }
    return -1;
  }();
  return index;
}

}  // namespace zo::test
