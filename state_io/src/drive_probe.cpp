#include "state_io/drive_probe.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "state_io/io_queue.h"
#include "state_io/state_file.h"

namespace zo::state_io {

DriveRates measure_drive(const std::filesystem::path& dir, std::uint64_t bytes) {
  constexpr std::size_t kPiece = std::size_t{16} << 20;
  constexpr unsigned kDepth = 8;
  const StateFile f = StateFile::create(dir, std::max<std::uint64_t>(bytes, kAlignment));
  std::string note;
  const auto q =
      make_io_queue({.kind = QueueKind::kAuto, .depth = kDepth, .threads = 2, .hook = {}}, &note);
  struct Free {
    void operator()(void* p) const noexcept { std::free(p); }
  };
  std::vector<std::unique_ptr<void, Free>> bufs;
  for (unsigned i = 0; i < kDepth; ++i) {
    bufs.emplace_back(std::aligned_alloc(kAlignment, kPiece));
    if (!bufs.back()) throw std::bad_alloc();
    std::memset(bufs.back().get(), int(i + 1), kPiece);
  }
  auto pass = [&](IoRequest::Op op) {
    std::vector<std::uint64_t> tickets(kDepth, 0);
    const auto t0 = std::chrono::steady_clock::now();
    std::size_t i = 0;
    for (std::uint64_t off = 0; off < f.size(); off += kPiece, ++i) {
      const std::size_t slot = i % kDepth;
      if (tickets[slot] != 0) q->wait(tickets[slot]);
      const std::size_t n = std::min<std::uint64_t>(kPiece, f.size() - off);
      tickets[slot] = q->submit({op, &f, off, bufs[slot].get(), n});
    }
    for (const std::uint64_t t : tickets)
      if (t != 0) q->wait(t);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return double(f.size()) / s * 1e-9;
  };
  DriveRates r;
  r.write_gbps = pass(IoRequest::Op::kWrite);
  r.read_gbps = pass(IoRequest::Op::kRead);
  r.queue = q->name() + (note.empty() ? "" : " (" + note + ")");
  r.io = f.direct() ? "O_DIRECT" : f.note();
  return r;
}

}  // namespace zo::state_io
