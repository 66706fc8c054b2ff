#include "tokenize/parallel_encode.h"

#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/parallel_pipeline.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "tokenize/utf8.h"

namespace zo::tokenize {
namespace {

// How far past its start a chunk keeps its piece ends for the walk before it to meet: walks agree
// after a piece or two in any text but a long run of one kind of character.
constexpr std::size_t kMeetWindow = 16 << 10;

// NFC in pieces cut after newlines: a newline composes with nothing and stops the reordering of
// combining marks, so NFC(a + b) = NFC(a) + NFC(b) when `a` ends with one.
std::string nfc_in_chunks(std::string_view text, std::size_t chunk_bytes) {
  std::vector<std::size_t> cuts{0};
  while (cuts.back() + chunk_bytes < text.size()) {
    const std::size_t nl = text.find('\n', cuts.back() + chunk_bytes);
    if (nl == std::string_view::npos || nl + 1 == text.size()) break;
    cuts.push_back(nl + 1);
  }
  cuts.push_back(text.size());
  std::vector<std::string> parts(cuts.size() - 1);
  tbb::parallel_for(std::size_t{0}, parts.size(), [&](std::size_t i) {
    parts[i] = to_nfc(text.substr(cuts[i], cuts[i + 1] - cuts[i]));
  });
  std::size_t size = 0;
  for (const auto& p : parts)
    size += p.size();
  std::string out;
  out.reserve(size);
  for (const auto& p : parts)
    out += p;
  return out;
}

// One chunk's walk: from `begin`, up to its first piece that ends at or past the next chunk.
struct Part {
  std::size_t begin = 0, stop = 0;  // where the walk started; where its last piece ends
  std::vector<std::uint32_t> ids;
  // (where a piece ends, how many ids the walk had by then), within kMeetWindow of `begin`
  std::vector<std::pair<std::size_t, std::size_t>> ends;

  // The ids that follow a piece ending at `at`, if this walk has a piece ending there.
  std::optional<std::size_t> ids_after(std::size_t at) const {
    if (at == begin) return 0;
    const auto it = std::lower_bound(ends.begin(), ends.end(), std::pair{at, std::size_t{0}});
    if (it == ends.end() || it->first != at) return std::nullopt;
    return it->second;
  }
};

// A normalized segment `s` on the arena's threads.
void encode_chunks(Encoders& encoders, std::string_view s, std::vector<std::uint32_t>& out,
                   std::size_t chunk_bytes) {
  std::vector<std::size_t> starts;  // character boundaries about chunk_bytes apart
  for (std::size_t at = 0; at < s.size(); at += chunk_bytes) {
    std::size_t b = at;
    while (b < s.size() && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80)
      ++b;
    if (b < s.size() && (starts.empty() || b > starts.back())) starts.push_back(b);
  }
  starts.push_back(s.size());

  std::size_t next = 0;  // the next chunk to walk
  std::size_t done = 0;  // where the last piece written to `out` ends
  const auto read = [&](tbb::flow_control& fc) -> std::size_t {
    if (next + 1 == starts.size()) fc.stop();
    return next++;
  };
  const auto walk = [&](std::size_t k) {
    auto p = std::make_shared<Part>();
    p->begin = p->stop = starts[k];
    const std::size_t end = starts[k + 1], window = std::min(p->begin + kMeetWindow, end);
    // A chunk inside one piece walks nothing: join encodes that piece once, from where the
    // walks before it ended (else every chunk of a long run encoded the rest of it: quadratic).
    encoders.local().encode_from(
        s, p->begin, p->ids,
        [&](std::size_t e) {
          if (e < window) p->ends.emplace_back(e, p->ids.size());
          p->stop = e;
          return e >= end;
        },
        end);
    return std::pair{k, std::shared_ptr<const Part>(std::move(p))};
  };
  const auto join = [&](const std::pair<std::size_t, std::shared_ptr<const Part>>& kp) {
    const Part* p = kp.second.get();
    const std::size_t end = starts[kp.first + 1];
    if (done >= end) return;  // a piece before this chunk reached past it
    std::optional<std::size_t> from = p->ids_after(done);
    if (!from) {  // walk on from `done` until a piece ends where one of p's did, or past `end`
      encoders.local().encode_from(s, done, out, [&](std::size_t e) {
        done = e;
        from = p->ids_after(e);
        return from || e >= end;
      });
      if (!from) return;
    }
    out.insert(out.end(), p->ids.begin() + static_cast<std::ptrdiff_t>(*from), p->ids.end());
    done = p->stop;
  };
  tbb::parallel_pipeline(
      static_cast<std::size_t>(2 * tbb::this_task_arena::max_concurrency()),
      tbb::make_filter<void, std::size_t>(tbb::filter_mode::serial_in_order, read) &
          tbb::make_filter<std::size_t, std::pair<std::size_t, std::shared_ptr<const Part>>>(
              tbb::filter_mode::parallel, walk) &
          tbb::make_filter<std::pair<std::size_t, std::shared_ptr<const Part>>, void>(
              tbb::filter_mode::serial_in_order, join));
  if (done != s.size()) throw std::logic_error("encode_parallel: the chunks' pieces do not meet");
}

}  // namespace

void encode_parallel(const Tokenizer& tokenizer, Encoders& encoders, std::string_view text,
                     std::vector<std::uint32_t>& out, std::size_t chunk_bytes) {
  chunk_bytes = std::max<std::size_t>(chunk_bytes, 1);
  tokenizer.for_each_segment(
      text,
      [&](std::string_view segment) {
        if (segment.size() < 2 * chunk_bytes || !tokenizer.resumable_split()) {
          // A segment holds no added token, so encode() only normalizes and splits it.
          encoders.local().encode(segment, out);
          return;
        }
        std::string storage;
        const std::string_view s = tokenizer.normalize(
            segment, storage, [&](std::string_view t) { return nfc_in_chunks(t, chunk_bytes); });
        encode_chunks(encoders, s, out, chunk_bytes);
      },
      [&](std::uint32_t id) { out.push_back(id); });
}

}  // namespace zo::tokenize
