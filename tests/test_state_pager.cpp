// StatePager: the optimizer state paged through staging slots over a file. A shadow copy in
// memory is the reference: every chunk read back equals what was last released, whatever the
// order of prefetches, acquires and clean or dirty releases; a chunk changed on the drive, or a
// failed transfer, is an error naming the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "cpu_adam/cpu_adam.h"
#include "optim/state_pager.h"
#include "run_binary.h"

namespace {

namespace fs = std::filesystem;
using zo::optim::ChunkSpan;
using zo::optim::SegmentSpan;
using zo::optim::StatePager;
using zo::optim::StateShape;
constexpr std::size_t kBlock = zo::cpu_adam::kQ8Block;

// Segments of odd sizes, blocks numbered as HostOptimizer numbers them.
std::vector<SegmentSpan> odd_segments() {
  std::vector<SegmentSpan> s;
  std::size_t b = 0, block = 0;
  for (const std::size_t n : {std::size_t(5), 3 * kBlock + 17, kBlock, std::size_t(1), 9 * kBlock,
                              std::size_t(777), 2 * kBlock - 1}) {
    s.push_back({b, b + n, block});
    b += n;
    block += zo::cpu_adam::q8_blocks(n);
  }
  return s;
}

TEST(StatePager, ChunksNeverSplitABlockAndCoverEverything) {
  const std::vector<SegmentSpan> segs = odd_segments();
  for (const std::size_t max : {std::size_t(1), kBlock, 3 * kBlock + 5, 100 * kBlock}) {
    const std::vector<ChunkSpan> chunks = zo::optim::plan_chunks(segs, max);
    std::size_t expect = 0, blocks = 0;
    for (const ChunkSpan& c : chunks) {
      EXPECT_EQ(c.begin, expect);
      EXPECT_LE(c.end - c.begin, std::max(max / kBlock * kBlock, kBlock)) << max;
      EXPECT_EQ(c.block_begin, blocks);
      expect = c.end;
      blocks = c.block_end;
      // The chunk ends at a segment's end or at a block boundary inside its segment.
      bool ok = false;
      for (const SegmentSpan& s : segs) {
        if (c.end == s.end || (c.end > s.begin && c.end < s.end && (c.end - s.begin) % kBlock == 0))
          ok = true;
      }
      EXPECT_TRUE(ok) << "chunk ends at " << c.end;
    }
    EXPECT_EQ(expect, segs.back().end);
    EXPECT_EQ(blocks,
              segs.back().block + zo::cpu_adam::q8_blocks(segs.back().end - segs.back().begin));
  }
  // Small segments share a chunk.
  EXPECT_EQ(zo::optim::plan_chunks(segs, 100 * kBlock).size(), 1u);
}

// The pager against a shadow: random operations, then every chunk read back.
void exercise(const StateShape& shape, zo::state_io::QueueKind kind, std::uint32_t seed) {
  const zo::test::TempDir d{"zo_state_pager_"};
  const std::vector<ChunkSpan> chunks = zo::optim::plan_chunks(odd_segments(), 2 * kBlock);
  std::vector<std::vector<std::uint8_t>> shadow(chunks.size());
  StatePager::Options o;
  o.dir = d.path;
  o.slots = 3;
  o.queue.kind = kind;
  auto bytes_of = [&](const StatePager::View& v) {
    return v.n * (shape.master_bytes + 2 * shape.moment_bytes) + 2 * v.blocks * 4;
  };
  // Packs a view's arrays into one vector, to compare with the shadow.
  auto pack = [&](const StatePager::View& v) {
    std::vector<std::uint8_t> out;
    auto add = [&](const void* p, std::size_t n) {
      if (n == 0) return;
      const auto* b = static_cast<const std::uint8_t*>(p);
      out.insert(out.end(), b, b + n);
    };
    add(v.master, v.n * shape.master_bytes);
    add(v.m, v.n * shape.moment_bytes);
    add(v.v, v.n * shape.moment_bytes);
    add(v.m_absmax, v.blocks * 4);
    add(v.v_absmax, v.blocks * 4);
    return out;
  };
  auto fresh = [&](const ChunkSpan& c, const StatePager::View& v) {
    // The starting state: master = the element index, moments zero.
    for (std::size_t i = 0; i < v.n; ++i)
      std::memcpy(static_cast<char*>(v.master) + i * shape.master_bytes, &i, 1);
    (void)c;
  };
  StatePager pager(chunks, shape, fresh, o);
  std::mt19937 rng(seed);
  for (int op = 0; op < 200; ++op) {
    const std::size_t c = rng() % chunks.size();
    if (rng() % 4 == 0) {
      pager.prefetch(rng() % chunks.size());
      continue;
    }
    const StatePager::View v = pager.acquire(c);
    ASSERT_EQ(v.n, chunks[c].end - chunks[c].begin);
    std::vector<std::uint8_t> now = pack(v);
    ASSERT_EQ(now.size(), bytes_of(v));
    if (!shadow[c].empty()) {
      ASSERT_EQ(now, shadow[c]) << "chunk " << c << " op " << op;
    }
    const bool dirty = rng() % 2 == 0;
    if (dirty) {  // change every array
      for (void* p : {v.master, v.m, v.v})
        static_cast<std::uint8_t*>(p)[rng() % v.n] ^= 0x5a;
      if (v.m_absmax != nullptr) v.m_absmax[rng() % v.blocks] += 1.0f;
    }
    shadow[c] = pack(v);
    pager.release(c, dirty);
  }
  pager.flush();
  EXPECT_GT(pager.bytes_written(), 0u);
  EXPECT_GT(pager.bytes_read(), 0u) << "three slots for " << chunks.size() << " chunks";
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    if (shadow[c].empty()) continue;
    const StatePager::View v = pager.acquire(c);
    EXPECT_EQ(pack(v), shadow[c]) << "chunk " << c;
    pager.release(c, false);
  }
}

TEST(StatePager, ReadsBackWhatWasReleasedInEveryFormatAndQueue) {
  for (const auto kind : {zo::state_io::QueueKind::kThreads, zo::state_io::QueueKind::kAuto}) {
    exercise({4, 4, false}, kind, 1);  // fp32 master and moments
    exercise({2, 2, false}, kind, 2);  // bf16 master and moments
    exercise({4, 1, true}, kind, 3);   // fp32 master, q8 moments with block maxima
  }
}

// A two-slot pager of fp32 state over odd_segments() in dir, with the given queue.
StatePager two_slot_pager(const fs::path& dir, zo::state_io::QueueOptions queue = {}) {
  StatePager::Options o;
  o.dir = dir;
  o.slots = 2;
  o.queue = std::move(queue);
  return StatePager(
      zo::optim::plan_chunks(odd_segments(), 2 * kBlock), {4, 4, false},
      [](const ChunkSpan&, const StatePager::View&) {}, o);
}

// Every chunk changed and written to the drive.
void write_every_chunk(StatePager& pager) {
  for (std::size_t c = 0; c < pager.chunks().size(); ++c) {
    pager.acquire(c);
    pager.release(c, true);
  }
  pager.flush();
}

TEST(StatePager, AChunkChangedOnTheDriveIsCaught) {
  const zo::test::TempDir d{"zo_state_pager_"};
  StatePager pager = two_slot_pager(d.path);
  write_every_chunk(pager);
  // Another program writes into the (unnamed) file through /proc: chunk 0's first byte.
  const std::string fd_path = "/proc/self/fd/" + std::to_string([&] {
                                for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
                                  std::error_code ec;
                                  const fs::path target = fs::read_symlink(e.path(), ec);
                                  if (!ec && target.string().find(d.path.string()) == 0)
                                    return std::stoi(e.path().filename());
                                }
                                return -1;
                              }());
  std::FILE* f = std::fopen(fd_path.c_str(), "r+b");
  ASSERT_NE(f, nullptr) << fd_path;
  std::fputc(0x7f, f);
  std::fclose(f);
  // Chunk 0 left memory long ago (two slots); reading it finds the change.
  try {
    pager.acquire(0);
    ADD_FAILURE() << "no error";
  } catch (const zo::state_io::IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("chunk 0"), std::string::npos) << m;
    EXPECT_NE(m.find("CRC-32C"), std::string::npos) << m;
    EXPECT_NE(m.find(d.path.string()), std::string::npos) << m;
  }
}

TEST(StatePager, AFailedWriteSurfacesWithTheFile) {
  const zo::test::TempDir d{"zo_state_pager_"};
  StatePager pager = two_slot_pager(
      d.path, {.kind = zo::state_io::QueueKind::kThreads,
               .depth = 16,
               .threads = 2,
               .hook = [](const zo::state_io::IoRequest& r, long res) {
                 return r.op == zo::state_io::IoRequest::Op::kWrite && r.offset > 0 ? -long(EIO)
                                                                                    : res;
               }});
  try {
    write_every_chunk(pager);
    ADD_FAILURE() << "no error";
  } catch (const zo::state_io::IoError& e) {
    EXPECT_NE(std::string(e.what()).find("Input/output error"), std::string::npos) << e.what();
  }
}

}  // namespace
