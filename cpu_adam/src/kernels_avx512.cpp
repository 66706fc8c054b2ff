// AVX-512 paths; this TU alone is compiled with AVX-512 flags (see CMakeLists.txt).
#include "adam_kernel.h"
#include "simd_avx512.h"
#include "simd_scalar.h"

namespace zo::cpu_adam::detail {

const KernelTable& kernels_avx512() {
  static const KernelTable table = make_kernel_table<Avx512Isa<false>, ScalarIsa>();
  return table;
}

const KernelTable& kernels_avx512_bf16() {
  static const KernelTable table = make_kernel_table<Avx512Isa<true>, ScalarIsa>();
  return table;
}

}  // namespace zo::cpu_adam::detail
