// AVX2 + FMA + F16C path; this TU alone is compiled with those flags (see CMakeLists.txt).
#include "adam_kernel.h"
#include "simd_avx2.h"
#include "simd_scalar.h"

namespace zo::cpu_adam::detail {

const KernelTable& kernels_avx2() {
  static const KernelTable table = make_kernel_table<Avx2Isa, ScalarIsa>();
  return table;
}

}  // namespace zo::cpu_adam::detail
