#include "core/dtype.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/half_bits.h"

namespace zo {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "fp32";
    case DType::kF16:
      return "fp16";
    case DType::kBF16:
      return "bf16";
  }
  return "invalid";
}

std::size_t dtype_size(DType t) {
  return t == DType::kF32 ? 4 : 2;
}

DType parse_dtype(std::string_view name) {
  if (name == "fp32" || name == "f32" || name == "float32") return DType::kF32;
  if (name == "fp16" || name == "f16" || name == "float16") return DType::kF16;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  throw std::invalid_argument("unknown dtype '" + std::string(name) +
                              "': use one of fp32, fp16, bf16");
}

std::uint16_t float_to_half(float x) {
  return f32_to_f16_bits(x);
}
float half_to_float(std::uint16_t h) {
  return f16_bits_to_f32(h);
}
std::uint16_t float_to_bf16(float x) {
  return f32_to_bf16_bits(x);
}
float bf16_to_float(std::uint16_t b) {
  return bf16_bits_to_f32(b);
}

void convert_from_float(const float* in, void* out, DType dtype, std::size_t n) {
  auto* o16 = static_cast<std::uint16_t*>(out);
  switch (dtype) {
    case DType::kF32:
      std::copy(in, in + n, static_cast<float*>(out));
      return;
    case DType::kF16:
      for (std::size_t i = 0; i < n; ++i)
        o16[i] = float_to_half(in[i]);
      return;
    case DType::kBF16:
      for (std::size_t i = 0; i < n; ++i)
        o16[i] = float_to_bf16(in[i]);
      return;
  }
}

void convert_to_float(const void* in, DType dtype, float* out, std::size_t n) {
  const auto* i16 = static_cast<const std::uint16_t*>(in);
  switch (dtype) {
    case DType::kF32:
      std::copy_n(static_cast<const float*>(in), n, out);
      return;
    case DType::kF16:
      for (std::size_t i = 0; i < n; ++i)
        out[i] = half_to_float(i16[i]);
      return;
    case DType::kBF16:
      for (std::size_t i = 0; i < n; ++i)
        out[i] = bf16_to_float(i16[i]);
      return;
  }
}

}  // namespace zo
