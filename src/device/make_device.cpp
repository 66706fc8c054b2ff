#include "device/make_device.h"

#include <stdexcept>

#ifdef ZO_HAVE_CUDA
#include "device/cuda_device.h"
#include "gpu/device.h"
#endif

namespace zo::dev {

std::unique_ptr<Device> make_device(const DeviceRequest& r) {
  std::string which = r.device;
#ifdef ZO_HAVE_CUDA
  if (which == "auto") which = gpu::no_device_reason().empty() ? "cuda" : "host";
  if (which == "cuda") {
    const std::string why = gpu::no_device_reason();
    if (!why.empty()) throw std::runtime_error("--device cuda: " + why);
    CudaDeviceOptions o;
    o.device = r.gpu_ordinal;
    o.capacity_bytes = r.capacity_bytes;
    o.act_dtype = r.precision == "auto" ? DType::kBF16 : parse_dtype(r.precision);
    return make_cuda_device(o);
  }
#else
  if (which == "auto") which = "host";
  if (which == "cuda") {
    throw std::runtime_error(
        "--device cuda: this build has no CUDA backend (configured without "
        "nvcc or with -DZO_CUDA=OFF); use --device host");
  }
#endif
  if (r.precision != "auto" && r.precision != "fp32") {
    throw std::runtime_error("--precision " + r.precision +
                             ": the host backend computes in "
                             "fp32 only; use --precision fp32 (or auto) with --device host");
  }
  HostDeviceOptions o;
  o.capacity_bytes = r.capacity_bytes;
  o.threads = r.threads;
  return make_host_device(o);
}

int numa_node_of(const Device& d) {
  return d.cuda_ordinal() >= 0 ? pinned::numa_node_of_gpu(d.cuda_ordinal()) : -1;
}

pinned::PinOptions staging_pin_options(const Device& d, bool pin) {
  pinned::PinOptions o;
  o.enable = pin && d.backend() == Backend::kCuda;
  if (const int node = numa_node_of(d); node >= 0) o.placement = pinned::placement_on_node(node);
  return o;
}

}  // namespace zo::dev
