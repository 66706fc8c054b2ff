#include "gpu/check.h"

#include <sstream>

#include "gpu/device.h"

namespace zo::gpu {
namespace detail {

const char* cuda_error_hint(cudaError_t code) {
  switch (code) {
    case cudaErrorNoDevice:
      return "no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES); "
             "use --device host to run on the CPU backend";
    case cudaErrorInsufficientDriver:
      return "the NVIDIA driver is missing or older than this build's CUDA runtime; "
             "install or update the driver, or use --device host to run on the CPU backend";
    case cudaErrorMemoryAllocation:
      return "the GPU is out of memory; lower the micro-batch size or free memory held by "
             "other processes (nvidia-smi)";
    case cudaErrorNoKernelImageForDevice:
      return "this build has no kernels for this GPU's architecture; reconfigure with "
             "-DCMAKE_CUDA_ARCHITECTURES=<compute capability, e.g. 80 or 90> and rebuild";
    case cudaErrorDevicesUnavailable:
      return "the GPU is busy or in exclusive-process mode; stop the other process or pick "
             "another device";
    default:
      return "";
  }
}

}  // namespace detail

std::string cuda_error_text(cudaError_t code) {
  std::string text = cudaGetErrorName(code);
  text += " (";
  text += cudaGetErrorString(code);
  text += ')';
  return text;
}

namespace detail {

void throw_cuda_error(cudaError_t code, const char* expr, const char* file, int line) {
  // A failed runtime call also sits in the runtime's last-error slot; clear it so the next
  // ZO_CUDA_CHECK_LAUNCH() does not report this (already thrown) error a second time. Sticky
  // errors (a corrupted context) survive this, as they should.
  (void)cudaGetLastError();

  std::ostringstream msg;
  msg << "CUDA error " << cuda_error_text(code) << " from `" << expr << "` at " << file << ':'
      << line;
  int device = -1;
  if (count_devices().count > 0 && cudaGetDevice(&device) == cudaSuccess) {
    msg << " (device " << device << ')';
  } else {
    msg << " (no usable CUDA device)";
  }
  (void)cudaGetLastError();  // the query above may have failed too
  if (const char* hint = cuda_error_hint(code); *hint != '\0') msg << ": " << hint;
  throw CudaError(code, msg.str());
}

}  // namespace detail
}  // namespace zo::gpu
