// Choosing and opening a backend, what the CUDA backend can see, and placing the host memory a
// backend copies to and from. The only place outside src/device/cuda_device.cpp that asks gpu/.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "device/device.h"
#include "pinned_memory/pinned_buffer.h"

namespace zo::dev {

struct DeviceRequest {
  std::string device = "auto";     // auto (cuda if a GPU is usable, else host), host or cuda
  std::string precision = "auto";  // auto (bf16 on cuda, fp32 on host), fp32, bf16 or fp16
  std::size_t capacity_bytes = 0;  // 0: the backend's default (see make_host/cuda_device)
  int threads = 0;                 // host backend compute threads; 0: all cores
  int gpu_ordinal = 0;             // the CUDA device to open (a data-parallel rank's local rank)
};

// Throws std::runtime_error with the reason and the fix when the request cannot be met.
std::unique_ptr<Device> make_device(const DeviceRequest& request);
// The request's words alone (device auto/host/cuda, precision auto/fp32/bf16/fp16), checked
// before anything slow: std::invalid_argument naming the flag.
void check_device_request(const DeviceRequest& request);

// What the CUDA backend sees, for `offload_train info` (the same answers in a build without it).
struct GpuInfo {
  int index = -1;
  std::string name;
  int cc_major = 0, cc_minor = 0;  // compute capability
  std::size_t total_bytes = 0, free_bytes = 0;
  int sm_count = 0;
  std::string unusable_reason;  // empty when this build can train on it
};
struct CudaInfo {
  bool built = false;       // the build has the CUDA backend
  bool nccl_built = false;  // and links NCCL
  std::vector<GpuInfo> gpus;
  // Empty when --device cuda can run; else one sentence with the reason and the fix.
  std::string no_device_reason;
};
CudaInfo cuda_info();

// The NUMA node nearest the device (its GPU's), or -1: unknown, or the host backend.
int numa_node_of(const Device& d);

// Options for host buffers the device copies to and from (gradient landing, parameter upload):
// page-locked when `pin`, by gpu/'s CUDA page-locking, on the GPU's NUMA node so DMA crosses no
// socket link; ordinary memory on the host backend, where a "copy" is a memcpy on a stream thread.
pinned::PinOptions staging_pin_options(const Device& d, bool pin);

}  // namespace zo::dev
