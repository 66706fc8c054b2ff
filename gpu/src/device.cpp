#include "gpu/device.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <stdexcept>
#include <string>

namespace zo::gpu {
namespace {

constexpr const char* kHostFallback = "use --device host to run on the CPU backend";

struct RawCount {
  cudaError_t status = cudaSuccess;
  int count = 0;
};

RawCount count_raw() noexcept {
  RawCount result;
  result.status = cudaGetDeviceCount(&result.count);
  if (result.status != cudaSuccess) {
    (void)cudaGetLastError();  // not a kernel-launch failure; keep it out of later checks
    result.count = 0;
  }
  return result;
}

// "cudaErrorNoDevice: no CUDA-capable device is detected".
std::string error_clause(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}

// Why the runtime sees no device at all, as a sentence ending in what to do.
std::string no_devices_sentence(cudaError_t status) {
  std::string why;
  switch (status) {
    case cudaSuccess:
    case cudaErrorNoDevice:
      why = "no CUDA device found";
      break;
    case cudaErrorInsufficientDriver:
      why = "no NVIDIA driver is installed, or it is older than this build's CUDA runtime";
      break;
    default:
      why = "the CUDA runtime could not be initialised";
      break;
  }
  if (status != cudaSuccess) why += " (" + error_clause(status) + ")";
  return why + "; " + kHostFallback;
}

// Marks `info` unusable when its compute capability is below what this build supports.
DeviceInfo check_compute_capability(DeviceInfo info) {
  if (info.usable() && (info.cc_major < kMinComputeMajor ||
                        (info.cc_major == kMinComputeMajor && info.cc_minor < kMinComputeMinor))) {
    info.unusable_reason = "compute capability " + std::to_string(info.cc_major) + "." +
                           std::to_string(info.cc_minor) + " is below the " +
                           std::to_string(kMinComputeMajor) + "." +
                           std::to_string(kMinComputeMinor) + " this build supports";
  }
  return info;
}

// How far describe() goes: properties only, or also opening the device (a CUDA context, which
// then lives as long as the process) to read its free memory and to find devices that are busy
// or in exclusive-process mode, switching back to the previous device or staying on it.
enum class Probe { kProperties, kOpenAndRestore, kOpenAndStay };

// Fills `index`'s description.
DeviceInfo describe(int index, Probe probe) {
  DeviceInfo info;
  info.index = index;

  cudaDeviceProp prop{};
  if (const cudaError_t status = cudaGetDeviceProperties(&prop, index); status != cudaSuccess) {
    (void)cudaGetLastError();
    info.unusable_reason = "its properties could not be read (" + error_clause(status) + ")";
    return info;
  }
  info.name = prop.name;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.total_bytes = prop.totalGlobalMem;
  info.sm_count = prop.multiProcessorCount;
  char bus_id[32];
  // Lower-case hex, as in /sys/bus/pci/devices/<id>.
  std::snprintf(bus_id, sizeof bus_id, "%04x:%02x:%02x.0", static_cast<unsigned>(prop.pciDomainID),
                static_cast<unsigned>(prop.pciBusID), static_cast<unsigned>(prop.pciDeviceID));
  info.pci_bus_id = bus_id;
  if (probe == Probe::kProperties) return check_compute_capability(info);

  int previous = 0;
  const bool have_previous = cudaGetDevice(&previous) == cudaSuccess;
  cudaError_t status = cudaSetDevice(index);
  if (status == cudaSuccess && probe == Probe::kOpenAndStay) {
    // Host threads that wait for the device (stream and event synchronisation) sleep instead
    // of spinning: the cores are CPU Adam's. Best effort: an already active context may keep its
    // flags.
    (void)cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync);
    (void)cudaGetLastError();
  }
  if (status == cudaSuccess) status = cudaMemGetInfo(&info.free_bytes, &info.total_bytes);
  if (status != cudaSuccess) {
    info.free_bytes = 0;
    info.unusable_reason = "it could not be opened (" + error_clause(status) + ")";
  }
  if (probe == Probe::kOpenAndRestore && have_previous && previous != index) {
    (void)cudaSetDevice(previous);
  }
  (void)cudaGetLastError();
  return check_compute_capability(info);
}

std::string device_label(const DeviceInfo& info) {
  std::string label = "device " + std::to_string(info.index);
  if (!info.name.empty()) label += " (" + info.name + ")";
  return label;
}

}  // namespace

DeviceCount count_devices() noexcept {
  const RawCount found = count_raw();
  DeviceCount result;
  result.count = found.count;
  if (found.status != cudaSuccess) {
    try {
      result.error = error_clause(found.status);
    } catch (...) {  // no memory for the text: the count alone still answers
    }
  }
  return result;
}

DeviceInfo describe_device(int index) {
  return describe(index, Probe::kProperties);
}

std::vector<DeviceInfo> query_devices() {
  const RawCount found = count_raw();
  std::vector<DeviceInfo> devices;
  devices.reserve(static_cast<std::size_t>(found.count));
  for (int i = 0; i < found.count; ++i)
    devices.push_back(describe(i, Probe::kOpenAndRestore));
  return devices;
}

std::string no_device_reason() {
  const RawCount found = count_raw();
  if (found.count == 0) return no_devices_sentence(found.status);

  // Properties only: opening every device would leave a context on each (on every rank of a
  // data-parallel job); the device actually used is opened, and checked, by require_device.
  std::string reason = "found " + std::to_string(found.count) + " CUDA device(s), none usable:";
  for (int i = 0; i < found.count; ++i) {
    const DeviceInfo info = describe_device(i);
    if (info.usable()) return {};
    reason.append(" ").append(device_label(info)).append(": ").append(info.unusable_reason);
    reason += ';';
  }
  return reason.append(" ").append(kHostFallback);
}

DeviceInfo require_device(int index) {
  const RawCount found = count_raw();
  if (found.count == 0) {
    throw std::runtime_error("CUDA device " + std::to_string(index) + " was requested, but " +
                             no_devices_sentence(found.status));
  }
  if (index < 0 || index >= found.count) {
    throw std::out_of_range("CUDA device index " + std::to_string(index) +
                            " is out of range: " + std::to_string(found.count) +
                            " device(s) are visible, use 0.." + std::to_string(found.count - 1) +
                            " (CUDA_VISIBLE_DEVICES renumbers them)");
  }
  DeviceInfo info = describe(index, Probe::kOpenAndStay);
  if (!info.usable()) {
    throw std::runtime_error("CUDA " + device_label(info) + " cannot be used: " +
                             info.unusable_reason + "; pick another device or " + kHostFallback);
  }
  return info;
}

}  // namespace zo::gpu
