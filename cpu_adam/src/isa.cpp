// Run-time ISA detection from cpuid and XCR0 (the OS must save the vector registers too).
#include <cpuid.h>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "cpu_adam/cpu_adam.h"

namespace zo::cpu_adam {
namespace {

struct CpuFeatures {
  bool avx2_fma_f16c = false;
  bool avx512 = false;  // F + BW + VL
  bool avx512_bf16 = false;
};

std::uint64_t read_xcr0() {
  std::uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<std::uint64_t>(edx) << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28),
             f16c = c & (1u << 29);
  if (!osxsave || !avx) return f;
  const std::uint64_t xcr0 = read_xcr0();
  const bool os_ymm = (xcr0 & 0x6) == 0x6;    // SSE + AVX state
  const bool os_zmm = (xcr0 & 0xe6) == 0xe6;  // + opmask, ZMM_Hi256, Hi16_ZMM
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  const bool avx2 = b & (1u << 5), avx512f = b & (1u << 16), avx512dq = b & (1u << 17),
             avx512bw = b & (1u << 30), avx512vl = b & (1u << 31);
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  const bool bf16 = __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) && (a1 & (1u << 5));
  f.avx2_fma_f16c = os_ymm && avx2 && fma && f16c;
  f.avx512 = f.avx2_fma_f16c && os_zmm && avx512f && avx512dq && avx512bw && avx512vl;
  f.avx512_bf16 = f.avx512 && bf16;
  return f;
}

const CpuFeatures& features() {
  static const CpuFeatures f = detect();
  return f;
}

}  // namespace

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx512Bf16:
      return "avx512bf16";
  }
  return "invalid";
}

Isa parse_isa(std::string_view name) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16}) {
    if (name == isa_name(isa)) return isa;
  }
  throw std::invalid_argument("unknown CPU Adam ISA '" + std::string(name) +
                              "': use one of scalar, avx2, avx512, avx512bf16");
}

bool isa_supported(Isa isa) {
  const CpuFeatures& f = features();
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return f.avx2_fma_f16c;
    case Isa::kAvx512:
      return f.avx512;
    case Isa::kAvx512Bf16:
      return f.avx512_bf16;
  }
  return false;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16}) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

Isa best_isa() {
  return supported_isas().back();
}

Isa default_isa() {
  const char* env = std::getenv("ZO_CPU_ADAM_ISA");
  if (env == nullptr || *env == '\0') return best_isa();
  const Isa isa = parse_isa(env);
  if (!isa_supported(isa)) {
    throw std::runtime_error(
        "ZO_CPU_ADAM_ISA=" + std::string(env) + " but this CPU cannot run it; best available is '" +
        std::string(isa_name(best_isa())) + "' (unset the variable to use it)");
  }
  return isa;
}

}  // namespace zo::cpu_adam
