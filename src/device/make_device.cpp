#include "device/make_device.h"

#include <stdexcept>

#ifdef ZO_HAVE_CUDA
#include "device/cuda_device.h"
#include "gpu/device.h"
#include "gpu/nccl_comm.h"
#include "gpu/runtime.h"
#endif

namespace zo::dev {
namespace {

#ifdef ZO_HAVE_CUDA
std::string no_cuda_device_reason() {
  return gpu::no_device_reason();
}
#else
std::string no_cuda_device_reason() {
  return "this build has no CUDA backend (configured without nvcc or with -DZO_CUDA=OFF); use "
         "--device host";
}
#endif

}  // namespace

void check_device_request(const DeviceRequest& r) {
  if (r.device != "auto" && r.device != "host" && r.device != "cuda")
    throw std::invalid_argument("--device must be auto, host or cuda (got '" + r.device + "')");
  if (r.precision != "auto" && r.precision != "fp32" && r.precision != "bf16" &&
      r.precision != "fp16") {
    throw std::invalid_argument("--precision must be auto, fp32, bf16 or fp16 (got '" +
                                r.precision + "')");
  }
}

std::unique_ptr<Device> make_device(const DeviceRequest& r) {
  std::string which = r.device;
  if (which == "auto") which = no_cuda_device_reason().empty() ? "cuda" : "host";
  if (which == "cuda") {
    const std::string why = no_cuda_device_reason();
    if (!why.empty()) throw std::runtime_error("--device cuda: " + why);
#ifdef ZO_HAVE_CUDA
    CudaDeviceOptions o;
    o.device = r.gpu_ordinal;
    o.capacity_bytes = r.capacity_bytes;
    o.act_dtype = r.precision == "auto" ? DType::kBF16 : parse_dtype(r.precision);
    return make_cuda_device(o);
#endif
  }
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

CudaInfo cuda_info() {
  CudaInfo info;
  info.no_device_reason = no_cuda_device_reason();
#ifdef ZO_HAVE_CUDA
  info.built = true;
  info.nccl_built = gpu::nccl_available();
  for (const gpu::DeviceInfo& d : gpu::query_devices()) {
    info.gpus.push_back({d.index, d.name, d.cc_major, d.cc_minor, d.total_bytes, d.free_bytes,
                         d.sm_count, d.unusable_reason});
  }
#endif
  return info;
}

int numa_node_of(const Device& d) {
#ifdef ZO_HAVE_CUDA
  if (d.cuda_ordinal() >= 0) {
    return pinned::numa_node_of_gpu(gpu::describe_device(d.cuda_ordinal()).pci_bus_id);
  }
#endif
  (void)d;
  return -1;
}

pinned::PinOptions staging_pin_options(const Device& d, bool pin) {
  pinned::PinOptions o;
  o.enable = pin && d.backend() == Backend::kCuda;
#ifdef ZO_HAVE_CUDA
  if (o.enable) {
    o.locker = {&gpu::page_lock_unavailable_reason, &gpu::page_lock, &gpu::page_unlock};
  }
#endif
  if (const int node = numa_node_of(d); node >= 0) o.placement = pinned::placement_on_node(node);
  return o;
}

}  // namespace zo::dev
