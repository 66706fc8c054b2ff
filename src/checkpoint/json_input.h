// JSON read from files: model specs and Hugging Face configs, safetensors headers, MANIFEST.json,
// trainer_state.json. Nesting is bounded while parsing, so a hostile file cannot overflow the stack
// of whatever later prints or compares the value (both recurse), and an object may not hold a key
// twice (nlohmann would silently keep one of the values).
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string_view>

namespace zo::ckpt {

// Nested objects and arrays allowed; the files above need fewer than 10.
inline constexpr int kMaxJsonDepth = 64;

// The text is not JSON, nests deeper than kMaxJsonDepth or repeats a key; what() says which and
// where (line and column, or the key), for the caller to prefix with the file's name.
class JsonError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

nlohmann::json parse_json(std::string_view text);

}  // namespace zo::ckpt
