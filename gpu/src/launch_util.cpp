#include <map>
#include <mutex>
#include <utility>

#include "launch_util.h"

namespace zo::gpu::detail {

void opt_in_shared_memory(int device, const void* kernel, std::size_t bytes) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, std::size_t> allowed;  // what each kernel has now
  const std::lock_guard<std::mutex> lock(mu);
  std::size_t& now = allowed[{device, kernel}];
  if (bytes <= now) return;
  ZO_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(bytes)));
  now = bytes;
}

}  // namespace zo::gpu::detail
