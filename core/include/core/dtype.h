// Element types of host arrays and exact scalar conversions between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace zo {

enum class DType : std::uint8_t { kF32, kF16, kBF16 };

std::string_view dtype_name(DType t);
std::size_t dtype_size(DType t);
// Accepts "fp32"/"f32"/"float32", "fp16"/"f16"/"float16", "bf16"/"bfloat16"; throws otherwise.
DType parse_dtype(std::string_view name);

// IEEE binary16 and bfloat16 as raw bits. float -> 16-bit rounds to nearest, ties to even,
// keeps subnormals, overflows to infinity and turns NaN into a quiet NaN of the same sign.
std::uint16_t float_to_half(float x);
float half_to_float(std::uint16_t h);
std::uint16_t float_to_bf16(float x);
float bf16_to_float(std::uint16_t b);
// out (n, dtype) = in (n) converted as above (a copy for kF32).
void convert_from_float(const float* in, void* out, DType dtype, std::size_t n);
// out (n) = in (n, dtype) widened exactly.
void convert_to_float(const void* in, DType dtype, float* out, std::size_t n);

}  // namespace zo
