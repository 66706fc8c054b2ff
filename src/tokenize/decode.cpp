#include "tokenize/decode.h"

namespace zo::tokenize {

std::string TextDecoder::push(std::int32_t id) {
  const auto bytes =
      id >= 0 ? tokenizer_.token_bytes(static_cast<std::uint32_t>(id)) : std::nullopt;
  return bytes ? text_.push(*bytes) : text_.finish() + "\xEF\xBF\xBD";
}

std::string decode_text(const Tokenizer& tokenizer, std::span<const std::int32_t> ids) {
  TextDecoder decoder(tokenizer);
  std::string out;
  for (const std::int32_t id : ids)
    out += decoder.push(id);
  return out;
}

}  // namespace zo::tokenize
