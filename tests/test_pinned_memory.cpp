#include "pinned_memory/host_buffer.h"

#include <gtest/gtest.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace zo::pinned {
namespace {

// The trainer's chunk: zo::cpu_adam::kChunkElements fp32 elements.
constexpr std::size_t kAdamChunkElements = 16384;
constexpr std::size_t kAdamChunkBytes = kAdamChunkElements * sizeof(float);

std::size_t page_size() {
  return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

std::size_t mem_total_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemTotal:", 0) == 0) {
      std::istringstream fields(line.substr(9));
      std::size_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

// Fills with random bytes, then checks every byte reads back.
void fill_and_verify(HostBuffer& buffer, std::uint32_t seed) {
  auto bytes = buffer.span<std::uint8_t>();
  std::mt19937 gen(seed);
  for (auto& b : bytes) {
    b = static_cast<std::uint8_t>(gen());
  }
  gen.seed(seed);
  std::size_t mismatches = 0;
  for (const auto b : bytes) {
    mismatches += b != static_cast<std::uint8_t>(gen()) ? 1 : 0;
  }
  EXPECT_EQ(mismatches, 0u) << "size " << buffer.size();
}

TEST(HostBuffer, OddSizesArePageAlignedAndWritable) {
  for (const std::size_t bytes :
       {std::size_t{1}, std::size_t{7}, std::size_t{4097}, std::size_t{65536},
        (std::size_t{3} << 20) + 5, (std::size_t{2} << 20) - 1}) {
    HostBuffer buffer(bytes);
    ASSERT_EQ(buffer.size(), bytes);
    ASSERT_FALSE(buffer.empty());
    ASSERT_NE(buffer.data(), nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer.data()) % page_size(), 0u) << bytes;
    if (bytes > (std::size_t{2} << 20)) {  // huge-page aligned so THP can back all of it
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer.data()) % (std::size_t{2} << 20), 0u);
    }
    fill_and_verify(buffer, static_cast<std::uint32_t>(bytes));
  }
}

TEST(HostBuffer, ZeroBytesIsEmpty) {
  HostBuffer buffer(0);
  EXPECT_TRUE(buffer.empty());
  EXPECT_EQ(buffer.size(), 0u);
  EXPECT_EQ(buffer.data(), nullptr);
  EXPECT_TRUE(buffer.span<float>().empty());
  buffer.first_touch(kAdamChunkBytes);  // no-op
  HostBuffer defaulted;
  EXPECT_TRUE(defaulted.empty());
}

TEST(HostBuffer, MoveTransfersOwnership) {
  HostBuffer a(10000);
  fill_and_verify(a, 1);
  const void* ptr = a.data();

  HostBuffer b(std::move(a));
  EXPECT_EQ(b.data(), ptr);
  EXPECT_EQ(b.size(), 10000u);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_EQ(a.size(), 0u);
  EXPECT_TRUE(a.empty());

  HostBuffer c(3 << 20);
  const void* old_c = c.data();
  c.span<std::uint8_t>()[0] = 1;  // resident, so a leak would still show as mapped
  c = std::move(b);
  EXPECT_EQ(c.data(), ptr);
  EXPECT_EQ(c.size(), 10000u);
  EXPECT_EQ(b.data(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(b.size(), 0u);
  // c's old mapping was released on assignment.
  EXPECT_EQ(page_nodes(old_c, 1), std::vector<int>{-EFAULT});

  // Contents moved with the pointer.
  std::mt19937 gen(1);
  const auto bytes = c.span<const std::uint8_t>();
  EXPECT_TRUE(std::all_of(bytes.begin(), bytes.end(),
                          [&](std::uint8_t v) { return v == static_cast<std::uint8_t>(gen()); }));
}

TEST(HostBuffer, SpanChecksElementSize) {
  HostBuffer buffer(4097);
  EXPECT_EQ(buffer.span<std::uint8_t>().size(), 4097u);
  EXPECT_THROW(buffer.span<float>(), std::logic_error);
  HostBuffer floats(4096 * sizeof(float));
  EXPECT_EQ(floats.span<float>().size(), 4096u);
  EXPECT_EQ(static_cast<void*>(floats.span<float>().data()), floats.data());
}

TEST(HostBuffer, FreshPagesAreNotResidentUntilFirstTouch) {
  const std::size_t bytes = (std::size_t{8} << 20) + 123;
  HostBuffer buffer(bytes);
  const std::vector<int> before = page_nodes(buffer.data(), buffer.size());
  ASSERT_EQ(before.size(), (bytes + page_size() - 1) / page_size());
  for (std::size_t i = 0; i < before.size(); ++i) {
    ASSERT_LT(before[i], 0) << "page " << i << " resident before any write";
  }

  buffer.first_touch(kAdamChunkBytes);
  const std::vector<int> after = page_nodes(buffer.data(), buffer.size());
  ASSERT_EQ(after.size(), before.size());
  for (std::size_t i = 0; i < after.size(); ++i) {
    ASSERT_GE(after[i], 0) << "page " << i << " not resident after first_touch";
  }
  const auto data = buffer.span<const std::uint8_t>();
  EXPECT_TRUE(std::all_of(data.begin(), data.end(), [](std::uint8_t v) { return v == 0; }));
}

TEST(HostBuffer, FirstTouchZeroFillsWithAnyChunkSize) {
  // Chunks that do not divide the size, a chunk larger than the buffer, one byte per chunk.
  for (const std::size_t chunk : {std::size_t{1000}, std::size_t{1} << 30, kAdamChunkBytes}) {
    HostBuffer buffer(kAdamChunkBytes * 5 + 17);
    fill_and_verify(buffer, 7);
    buffer.first_touch(chunk);
    const auto data = buffer.span<const std::uint8_t>();
    EXPECT_TRUE(std::all_of(data.begin(), data.end(), [](std::uint8_t v) { return v == 0; }))
        << "chunk " << chunk;
  }
  HostBuffer small(4097);
  fill_and_verify(small, 3);
  small.first_touch(1);
  const auto data = small.span<const std::uint8_t>();
  EXPECT_TRUE(std::all_of(data.begin(), data.end(), [](std::uint8_t v) { return v == 0; }));
  EXPECT_THROW(small.first_touch(0), std::invalid_argument);
}

TEST(HostBuffer, FirstTouchRunsInTheCallersArena) {
  HostBuffer buffer(kAdamChunkBytes * 37 + 5);
  tbb::task_arena arena(2);
  arena.execute([&] { buffer.first_touch(kAdamChunkBytes); });
  const std::vector<int> nodes = page_nodes(buffer.data(), buffer.size());
  EXPECT_TRUE(std::all_of(nodes.begin(), nodes.end(), [](int n) { return n >= 0; }));
}

TEST(HostBuffer, AllocateArrayIsTypedAndTouched) {
  const std::size_t count = 3 * kAdamChunkElements + 11;
  HostBuffer buffer = HostBuffer::allocate_array<float>(count, {}, kAdamChunkElements);
  const auto values = buffer.span<float>();
  ASSERT_EQ(values.size(), count);
  EXPECT_TRUE(std::all_of(values.begin(), values.end(), [](float v) { return v == 0.0f; }));
  const std::vector<int> nodes = page_nodes(buffer.data(), buffer.size());
  EXPECT_TRUE(std::all_of(nodes.begin(), nodes.end(), [](int n) { return n >= 0; }));

  HostBuffer untouched = HostBuffer::allocate_array<double>(1000);
  EXPECT_EQ(untouched.size(), 1000 * sizeof(double));
  EXPECT_LT(page_nodes(untouched.data(), untouched.size())[0], 0);

  EXPECT_THROW(HostBuffer::allocate_array<double>(std::numeric_limits<std::size_t>::max() / 4),
               std::invalid_argument);
}

TEST(HostBuffer, NodePlacementPutsPagesOnThatNode) {
  HostBuffer buffer((std::size_t{4} << 20) + 4097, {Placement::kNode, 0});
  EXPECT_TRUE(buffer.placement().policy == Placement::kNode ||
              buffer.placement().policy == Placement::kFirstTouch);
  buffer.first_touch(kAdamChunkBytes);
  const std::vector<int> nodes = page_nodes(buffer.data(), buffer.size());
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    ASSERT_EQ(nodes[i], 0) << "page " << i;
  }
}

TEST(HostBuffer, InterleavePlacementSpreadsOverAllowedNodes) {
  HostBuffer buffer(std::size_t{16} << 20, {Placement::kInterleave, 0});
  fill_and_verify(buffer, 11);
  const std::vector<int> nodes = page_nodes(buffer.data(), buffer.size());
  const std::set<int> distinct(nodes.begin(), nodes.end());
  for (const int n : distinct) {
    EXPECT_GE(n, 0);
  }
  if (buffer.placement().policy == Placement::kInterleave && numa_node_count() > 1) {
    EXPECT_GT(distinct.size(), 1u);
  } else {
    EXPECT_EQ(distinct.size(), 1u);
  }
}

TEST(HostBuffer, RejectsNodesThatDoNotExist) {
  EXPECT_THROW(HostBuffer(4096, {Placement::kNode, -1}), std::invalid_argument);
  const int missing = 1 << 20;
  try {
    HostBuffer buffer(4096, {Placement::kNode, missing});
    // Only without NUMA support, where every policy degrades to first touch.
    EXPECT_EQ(buffer.placement().policy, Placement::kFirstTouch);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(missing)), std::string::npos) << e.what();
  }
}

TEST(HostBuffer, AbsurdRequestThrowsWithNumbers) {
  const std::size_t absurd = std::size_t{1} << 50;
  try {
    HostBuffer buffer(absurd);
    FAIL() << "allocating 1 PiB succeeded";
  } catch (const HostMemoryError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(std::to_string(absurd)), std::string::npos) << what;
    EXPECT_NE(what.find("MemAvailable"), std::string::npos) << what;
    EXPECT_EQ(e.requested_bytes(), absurd);
    EXPECT_GT(e.available_bytes(), 0u);
  }
  EXPECT_THROW(HostBuffer(std::numeric_limits<std::size_t>::max()), HostMemoryError);
  EXPECT_THROW(HostBuffer::allocate_array<float>(std::size_t{1} << 50), std::runtime_error);
}

TEST(HostMemory, AvailableBytesIsPlausible) {
  const std::size_t available = host_available_bytes();
  EXPECT_GT(available, 0u);
  const std::size_t total = mem_total_bytes();
  if (total > 0) {
    EXPECT_LE(available, total);
  }
}

TEST(HostMemory, NumaNodeCountIsPositive) {
  EXPECT_GE(numa_node_count(), 1);
}

TEST(HostMemory, PageNodesCoversPartialPages) {
  HostBuffer buffer(3 * page_size());
  const auto* base = static_cast<const std::byte*>(buffer.data());
  EXPECT_TRUE(page_nodes(base, 0).empty());
  EXPECT_EQ(page_nodes(base + 1, 1).size(), 1u);
  EXPECT_EQ(page_nodes(base + page_size() - 1, 2).size(), 2u);
  EXPECT_EQ(page_nodes(base + 1, 3 * page_size() - 1).size(), 3u);
  const std::vector<int> before = page_nodes(base, buffer.size());
  EXPECT_TRUE(std::all_of(before.begin(), before.end(), [](int n) { return n == -ENOENT; }));
  // Writing one byte makes its page resident (neighbours may follow where multi-size THP is on).
  buffer.span<std::uint8_t>()[page_size() + 5] = 42;
  const std::vector<int> after = page_nodes(base, buffer.size());
  ASSERT_EQ(after.size(), 3u);
  EXPECT_GE(after[1], 0);
}

}  // namespace
}  // namespace zo::pinned
