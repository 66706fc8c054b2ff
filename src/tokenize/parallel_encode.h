// One long document encoded on every thread of the current task arena, with exactly the ids one
// Encoder gives it (a .txt file is one document). The pre-tokenizer's first regex is walked from
// the start of each chunk at once; where a chunk's walk meets a piece end of the walk before it,
// the two agree from there on (SplitRegex::resumable), so the chunks' ids are joined at such a
// point, in order, and a chunk whose walk never meets it is walked again from where the one
// before it ended. NFC, when the tokenizer has it, runs on pieces cut after newlines.
#pragma once

#include <oneapi/tbb/enumerable_thread_specific.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenize/tokenizer.h"

namespace zo::tokenize {

using Encoders = tbb::enumerable_thread_specific<Encoder>;

// Appends the ids of `text` (valid UTF-8) to `out`, as Encoder::encode would. Each stretch
// between non-special added tokens of at least two chunks is split into chunks of about
// `chunk_bytes`; shorter ones, and tokenizers whose first regex cannot be resumed, run on one
// thread. `encoders` holds one Encoder per thread, none of them inside a call.
void encode_parallel(const Tokenizer& tokenizer, Encoders& encoders, std::string_view text,
                     std::vector<std::uint32_t>& out, std::size_t chunk_bytes);

}  // namespace zo::tokenize
