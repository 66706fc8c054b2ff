#include "core/state_format.h"

#include <stdexcept>
#include <string>

namespace zo {

std::string_view state_format_name(StateFormat f) {
  switch (f) {
    case StateFormat::kF32:
      return "fp32";
    case StateFormat::kBF16:
      return "bf16";
    case StateFormat::kQ8:
      return "q8";
  }
  return "?";
}

StateFormat parse_state_format(std::string_view name) {
  if (name == "fp32" || name == "f32" || name == "float32") return StateFormat::kF32;
  if (name == "bf16" || name == "bfloat16") return StateFormat::kBF16;
  if (name == "q8") return StateFormat::kQ8;
  throw std::invalid_argument("--optimizer-state '" + std::string(name) +
                              "': use fp32, bf16 or q8 (8-bit block-wise)");
}

std::size_t state_element_bytes(StateFormat f) {
  return f == StateFormat::kF32 ? 4 : f == StateFormat::kBF16 ? 2 : 1;
}

}  // namespace zo
