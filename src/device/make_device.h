// Choosing and opening a backend, and placing the host memory a backend copies to and from.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

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

// The NUMA node nearest the device (its GPU's), or -1: unknown, or the host backend.
int numa_node_of(const Device& d);

// Options for host buffers the device copies to and from (gradient landing, parameter upload):
// page-locked when `pin`, on the GPU's NUMA node so DMA crosses no socket link; ordinary memory
// on the host backend, where a "copy" is a memcpy on a stream thread.
pinned::PinOptions staging_pin_options(const Device& d, bool pin);

}  // namespace zo::dev
