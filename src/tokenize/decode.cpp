#include "tokenize/decode.h"

#include "tokenize/utf8.h"

namespace zo::tokenize {

std::string decode_text(const Tokenizer& tokenizer, std::span<const std::int32_t> ids) {
  Utf8Stream text;
  std::string out;
  for (const std::int32_t id : ids) {
    const auto bytes =
        id >= 0 ? tokenizer.token_bytes(static_cast<std::uint32_t>(id)) : std::nullopt;
    out += bytes ? text.push(*bytes) : text.finish() + "\xEF\xBF\xBD";
  }
  return out;
}

}  // namespace zo::tokenize
