// How the optimizer keeps Adam's m and v on the host: fp32, bf16 (rounded to nearest even), or
// q8 (8-bit codes of a dynamic map with one fp32 absmax per block of 2048; cpu_adam/cpu_adam.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace zo {

enum class StateFormat : std::uint8_t { kF32, kBF16, kQ8 };

std::string_view state_format_name(StateFormat f);  // "fp32", "bf16", "q8"
// "fp32" (or "f32", "float32"), "bf16" (or "bfloat16"), "q8"; throws std::invalid_argument
// naming --optimizer-state otherwise.
StateFormat parse_state_format(std::string_view name);
// Bytes of one moment per element (q8's block maxima come on top: 4 bytes per block).
std::size_t state_element_bytes(StateFormat f);

}  // namespace zo
