// Which CUDA devices exist and whether this build can run on them: the one place that asks the
// runtime (the trainer's device choice, `offload_train info`, error messages and page-locking all
// come here). Querying never throws for a machine without a GPU or driver: the trainer then falls
// back to the host backend.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace zo::gpu {

// The build targets sm_80 and sm_90 (native bf16); older GPUs are refused.
inline constexpr int kMinComputeMajor = 8;
inline constexpr int kMinComputeMinor = 0;

struct DeviceInfo {
  int index = -1;  // CUDA runtime ordinal (after CUDA_VISIBLE_DEVICES renumbering)
  std::string name;
  std::string pci_bus_id;  // "0000:3b:00.0"; locates the GPU's NUMA node in sysfs
  int cc_major = 0;
  int cc_minor = 0;
  std::size_t total_bytes = 0;
  std::size_t free_bytes = 0;  // at query time; 0 when the device could not be opened
  int sm_count = 0;
  // Empty when this build can run on the device; otherwise why not (too old, busy, ...).
  std::string unusable_reason;

  bool usable() const noexcept { return unusable_reason.empty(); }
};

// How many devices the runtime sees (0 without a GPU or driver) and, when it could not count
// them, why ("cudaErrorNoDevice: no CUDA-capable device is detected"). Never throws.
struct DeviceCount {
  int count = 0;
  std::string error;  // empty when the runtime answered
};
DeviceCount count_devices() noexcept;

// Device `index` from its properties alone (no context is opened, free_bytes stays 0); marked
// unusable when the properties cannot be read or the device is too old. Never throws.
DeviceInfo describe_device(int index);

// Every visible device, usable or not; empty when there is no GPU, no driver or a driver too old
// for this runtime. Opens a context on each device to read its free memory. Never throws.
std::vector<DeviceInfo> query_devices();

// Empty when at least one device this build supports exists (judged from its properties, without
// opening it: a busy device is reported by require_device); otherwise one sentence saying what is
// wrong and what to do, e.g. "no CUDA device found (cudaErrorNoDevice: ...); use --device host".
std::string no_device_reason();

// The device `index` if this build can run on it, left as the calling thread's current device;
// throws std::out_of_range for an index that is not visible and std::runtime_error when there is
// no GPU or the device is unusable.
DeviceInfo require_device(int index);

}  // namespace zo::gpu
