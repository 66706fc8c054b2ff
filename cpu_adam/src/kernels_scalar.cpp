// Portable path, compiled with the baseline flags.
#include "adam_kernel.h"
#include "simd_scalar.h"

namespace zo::cpu_adam::detail {

const KernelTable& kernels_scalar() {
  static const KernelTable table = make_kernel_table<ScalarIsa, ScalarIsa>();
  return table;
}

}  // namespace zo::cpu_adam::detail
