#include "pinned_memory/host_buffer.h"

#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "pinned_memory/bucket_ring.h"
#include "pinned_memory/pinned_buffer.h"

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

// Data-parallel ranks run next to their GPU: binding happens only when nobody bound the
// process before (each case in its own thread, whose affinity it may change).
TEST(RunNearNode, BindsOnlyAnUnboundThreadToAValidNode) {
  std::thread([] {
    EXPECT_FALSE(zo::pinned::run_near_node(-1));
    EXPECT_FALSE(zo::pinned::run_near_node(zo::pinned::numa_node_count() + 64));
  }).join();
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs two CPUs to restrict one";
  std::thread([] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
    EXPECT_FALSE(zo::pinned::run_near_node(0)) << "a launcher's binding is kept";
    cpu_set_t now;
    ASSERT_EQ(sched_getaffinity(0, sizeof now, &now), 0);
    EXPECT_EQ(CPU_COUNT(&now), 1);
    EXPECT_TRUE(CPU_ISSET(0, &now));
  }).join();
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

// ---- pinned buffers and rings ------------------------------------------------------------

constexpr std::size_t kMiB = std::size_t{1} << 20;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Collects warnings for the lifetime of the object, then restores the previous sink.
class WarningCapture {
 public:
  WarningCapture() {
    previous_ = set_warning_sink([this](const std::string& message) {
      const std::lock_guard<std::mutex> lock(mutex_);
      messages_.push_back(message);
    });
  }
  ~WarningCapture() { set_warning_sink(std::move(previous_)); }
  WarningCapture(const WarningCapture&) = delete;
  WarningCapture& operator=(const WarningCapture&) = delete;

  std::vector<std::string> messages() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return messages_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> messages_;
  WarningSink previous_;
};

// Lowers the RLIMIT_MEMLOCK soft limit; the destructor restores it (raising a soft limit back up
// to the unchanged hard limit needs no privilege).
class MemlockLimitGuard {
 public:
  explicit MemlockLimitGuard(rlim_t soft) {
    EXPECT_EQ(::getrlimit(RLIMIT_MEMLOCK, &saved_), 0);
    rlimit lowered = saved_;
    lowered.rlim_cur = std::min(soft, saved_.rlim_max);
    EXPECT_EQ(::setrlimit(RLIMIT_MEMLOCK, &lowered), 0) << std::strerror(errno);
  }
  ~MemlockLimitGuard() { ::setrlimit(RLIMIT_MEMLOCK, &saved_); }
  MemlockLimitGuard(const MemlockLimitGuard&) = delete;
  MemlockLimitGuard& operator=(const MemlockLimitGuard&) = delete;

 private:
  rlimit saved_{};
};

// CAP_IPC_LOCK in the initial user namespace (what memlock_limit_bytes() treats as exempt).
bool exempt_from_memlock() {
  std::ifstream status("/proc/self/status");
  std::string line;
  unsigned long long caps = 0;
  while (std::getline(status, line)) {
    if (line.rfind("CapEff:", 0) == 0) caps = std::stoull(line.substr(7), nullptr, 16);
  }
  std::ifstream uid_map("/proc/self/uid_map");
  unsigned long long inside = 1, outside = 1, count = 0;
  uid_map >> inside >> outside >> count;
  return (caps >> 14 & 1) != 0 && inside == 0 && outside == 0 && count == 4294967295ull;
}

// A PageLocker that locks nothing and records its calls, so that the pinned path runs without a
// GPU (gpu/'s CUDA locker is tested in test_gpu). Plain functions over this state, as a locker's
// are; the counters are atomic for threads. One FakeLocker at a time.
namespace fake {
std::atomic<int> locks{0}, unlocks{0};
std::atomic<bool> last_portable{false};
std::atomic<void*> last_data{nullptr};
std::atomic<std::size_t> last_bytes{0};
std::optional<std::string> unavailable;  // set between buffers, never while one is made
std::optional<std::string> refusal;

std::optional<std::string> unavailable_reason() {
  return unavailable;
}
std::optional<std::string> lock(void* data, std::size_t bytes, bool portable) {
  ++locks;
  last_data = data;
  last_bytes = bytes;
  last_portable = portable;
  return refusal;
}
void unlock(void*) noexcept {
  ++unlocks;
}
}  // namespace fake

class FakeLocker {
 public:
  FakeLocker() { reset(); }
  ~FakeLocker() { reset(); }
  FakeLocker(const FakeLocker&) = delete;
  FakeLocker& operator=(const FakeLocker&) = delete;

  PageLocker locker() const { return {&fake::unavailable_reason, &fake::lock, &fake::unlock}; }
  // A locker whose GPU is missing (`why`), or present again (nullopt).
  void unavailable(std::optional<std::string> why) { fake::unavailable = std::move(why); }
  // lock() answers with `why` (nullopt: success).
  void refuse(std::optional<std::string> why) { fake::refusal = std::move(why); }

 private:
  static void reset() {
    fake::locks = 0;
    fake::unlocks = 0;
    fake::last_portable = false;
    fake::last_data = nullptr;
    fake::last_bytes = 0;
    fake::unavailable.reset();
    fake::refusal.reset();
  }
};

TEST(PinnedBuffer, DisabledPinningIsPageableAndSilent) {
  WarningCapture warnings;
  PinnedBuffer buffer((std::size_t{3} << 20) + 5, PinOptions{.enable = false});
  EXPECT_FALSE(buffer.is_pinned());
  EXPECT_TRUE(buffer.fallback_reason().empty());
  EXPECT_TRUE(warnings.messages().empty());
  ASSERT_EQ(buffer.size(), (std::size_t{3} << 20) + 5);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer.data()) % page_size(), 0u);
  auto bytes = buffer.span<std::uint8_t>();
  std::fill(bytes.begin(), bytes.end(), std::uint8_t{0x5a});
  EXPECT_TRUE(std::all_of(bytes.begin(), bytes.end(), [](std::uint8_t v) { return v == 0x5a; }));
}

// No locker at all (a build without CUDA) and a locker whose GPU is missing: the same fallback,
// each with its own reason.
TEST(PinnedBuffer, FallsBackWithExactlyOneWarningWhenItCannotPin) {
  FakeLocker fake;
  fake.unavailable("no GPU in this test, check the driver");
  for (const PageLocker& locker : {PageLocker{}, fake.locker()}) {
    const std::optional<std::string> reason = pin_unavailable_reason(locker);
    ASSERT_TRUE(reason);
    EXPECT_TRUE(contains(*reason, "--no-pin")) << *reason;
    {
      WarningCapture warnings;
      PinnedBuffer buffer(3 * kMiB, PinOptions{.locker = locker});
      EXPECT_FALSE(buffer.is_pinned());
      EXPECT_EQ(buffer.fallback_reason(), *reason);
      const std::vector<std::string> messages = warnings.messages();
      ASSERT_EQ(messages.size(), 1u);
      EXPECT_TRUE(contains(messages[0], *reason)) << messages[0];
      EXPECT_TRUE(contains(messages[0], "pageable")) << messages[0];
      EXPECT_EQ(pinned_bytes_in_use(), 0u);
      buffer.span<std::uint32_t>()[12345] = 7;  // still usable memory
      EXPECT_EQ(buffer.span<const std::uint32_t>()[12345], 7u);
    }
    {
      WarningCapture warnings;
      PinnedBuffer quiet(kMiB, PinOptions{.locker = locker, .warn = false});
      EXPECT_FALSE(quiet.is_pinned());
      EXPECT_EQ(quiet.fallback_reason(), *reason);
      EXPECT_TRUE(warnings.messages().empty());
    }
  }
  EXPECT_TRUE(contains(*pin_unavailable_reason(fake.locker()), "check the driver"));
  EXPECT_EQ(fake::locks, 0) << "a locker without a GPU is never asked to lock";
}

TEST(PinnedBuffer, PinsThroughItsLockerAndUnlocksOnce) {
  FakeLocker fake;
  EXPECT_FALSE(pin_unavailable_reason(fake.locker()));
  const std::size_t bytes = 8 * kMiB;
  const bool fits = !pin_precheck(bytes, memlock_limit_bytes(), host_available_bytes());
  WarningCapture warnings;
  const std::size_t before = pinned_bytes_in_use();
  {
    PinnedBuffer buffer(bytes, PinOptions{.locker = fake.locker(), .portable = true});
    if (!fits) {  // a low RLIMIT_MEMLOCK without CAP_IPC_LOCK: the fallback is the right answer
      EXPECT_FALSE(buffer.is_pinned());
      EXPECT_TRUE(contains(buffer.fallback_reason(), "RLIMIT_MEMLOCK"));
      EXPECT_EQ(fake::locks, 0);
      return;
    }
    EXPECT_TRUE(buffer.is_pinned()) << buffer.fallback_reason();
    EXPECT_EQ(fake::locks, 1);
    EXPECT_EQ(fake::last_data, buffer.data());
    EXPECT_EQ(fake::last_bytes, bytes);
    EXPECT_TRUE(fake::last_portable);
    EXPECT_TRUE(warnings.messages().empty());
    EXPECT_EQ(pinned_bytes_in_use(), before + bytes);
    PinnedBuffer moved(std::move(buffer));
    EXPECT_TRUE(moved.is_pinned());
    EXPECT_FALSE(buffer.is_pinned());  // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(pinned_bytes_in_use(), before + bytes);
    EXPECT_EQ(fake::unlocks, 0);
  }
  EXPECT_EQ(fake::unlocks, 1) << "unlocked once, by the buffer that owned the pages last";
  EXPECT_EQ(pinned_bytes_in_use(), before);
  // Unchecked memlock still pins (the driver does not charge the limit).
  PinnedBuffer unchecked(kMiB, PinOptions{.locker = fake.locker(), .check_memlock = false});
  EXPECT_TRUE(unchecked.is_pinned()) << unchecked.fallback_reason();
  EXPECT_FALSE(fake::last_portable);
  // A locker that refuses (a driver error): the fallback names its reason and the fix, once.
  fake.refuse("the driver refused the registration");
  WarningCapture refusals;
  PinnedBuffer refused(kMiB, PinOptions{.locker = fake.locker()});
  EXPECT_FALSE(refused.is_pinned());
  EXPECT_TRUE(contains(refused.fallback_reason(), "the driver refused"))
      << refused.fallback_reason();
  EXPECT_TRUE(contains(refused.fallback_reason(), "--no-pin")) << refused.fallback_reason();
  EXPECT_EQ(refusals.messages().size(), 1u);
}

TEST(PinnedBuffer, EmptyAndMoveSemantics) {
  WarningCapture warnings;
  PinnedBuffer empty(0);
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_FALSE(empty.is_pinned());
  EXPECT_TRUE(empty.fallback_reason().empty());
  EXPECT_TRUE(warnings.messages().empty());

  PinnedBuffer a(10000, PinOptions{.warn = false});
  const void* ptr = a.data();
  const bool pinned = a.is_pinned();
  const std::string reason = a.fallback_reason();
  PinnedBuffer b(std::move(a));
  EXPECT_EQ(b.data(), ptr);
  EXPECT_EQ(b.size(), 10000u);
  EXPECT_EQ(b.is_pinned(), pinned);
  EXPECT_EQ(b.fallback_reason(), reason);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_FALSE(a.is_pinned());
  EXPECT_TRUE(a.fallback_reason().empty());

  PinnedBuffer c(5 * kMiB, PinOptions{.enable = false});
  const void* old_c = c.data();
  c.span<std::uint8_t>()[0] = 1;
  c = std::move(b);
  EXPECT_EQ(c.data(), ptr);
  EXPECT_EQ(c.is_pinned(), pinned);
  EXPECT_EQ(page_nodes(old_c, 1), std::vector<int>{-EFAULT});  // released on assignment
  EXPECT_TRUE(warnings.messages().empty());
}

TEST(PinnedBuffer, PlacementAndFirstTouchApplyBeforePinning) {
  const std::size_t bytes = 4 * kMiB + 4097;
  PinnedBuffer buffer(bytes, PinOptions{.enable = false,
                                        .placement = {Placement::kNode, 0},
                                        .first_touch_chunk_bytes = kAdamChunkBytes});
  EXPECT_TRUE(buffer.placement().policy == Placement::kNode ||
              buffer.placement().policy == Placement::kFirstTouch);
  const std::vector<int> nodes = page_nodes(buffer.data(), buffer.size());
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    ASSERT_EQ(nodes[i], 0) << "page " << i;  // resident (touched) on node 0
  }
  EXPECT_EQ(placement_on_node(-1).policy, Placement::kFirstTouch);
  EXPECT_EQ(placement_on_node(1).policy, Placement::kNode);
  EXPECT_EQ(placement_on_node(1).node, 1);
  // What HostBuffer rejects, PinnedBuffer rejects the same way.
  EXPECT_THROW(PinnedBuffer(4096, PinOptions{.placement = {Placement::kNode, -1}}),
               std::invalid_argument);
  EXPECT_THROW(PinnedBuffer(std::size_t{1} << 50, PinOptions{.enable = false}), HostMemoryError);
}

TEST(PinPrecheck, MessagesNameTheLimitTheNumbersAndTheFix) {
  const std::size_t limit = 64 * 1024;
  const std::size_t available = std::size_t{16} << 30;
  EXPECT_FALSE(pin_precheck(limit, limit, available));
  EXPECT_FALSE(pin_precheck(kMiB, kUnlimited, available, std::size_t{1} << 40));
  EXPECT_FALSE(pin_precheck(kMiB, 2 * kMiB, available, kMiB));

  const std::optional<std::string> over = pin_precheck(kMiB, limit, available);
  ASSERT_TRUE(over);
  for (const std::string& part :
       {std::string("RLIMIT_MEMLOCK"), std::string("memlock"), std::to_string(limit),
        std::to_string(kMiB), std::string("ulimit -l unlimited"), std::string("--no-pin")}) {
    EXPECT_TRUE(contains(*over, part)) << "missing '" << part << "' in: " << *over;
  }
  // What is locked already counts against the same limit, and overflow cannot wrap around.
  const std::optional<std::string> cumulative = pin_precheck(kMiB, 2 * kMiB, available, kMiB + 1);
  ASSERT_TRUE(cumulative);
  EXPECT_TRUE(contains(*cumulative, std::to_string(kMiB + 1))) << *cumulative;
  EXPECT_TRUE(pin_precheck(kUnlimited - 1, kUnlimited - 1, 0, 2));

  const std::optional<std::string> ram = pin_precheck(2 * kMiB, kUnlimited, kMiB);
  ASSERT_TRUE(ram);
  EXPECT_TRUE(contains(*ram, "MemAvailable")) << *ram;
  EXPECT_TRUE(contains(*ram, std::to_string(kMiB))) << *ram;
  EXPECT_TRUE(contains(*ram, "--no-pin")) << *ram;
  EXPECT_FALSE(pin_precheck(2 * kMiB, kUnlimited, 0));  // MemAvailable unknown: not checked
}

TEST(PinPrecheck, LoweredMemlockLimitIsSeenAndReported) {
  const rlim_t lowered = 64 * 1024;
  rlimit original{};
  ASSERT_EQ(::getrlimit(RLIMIT_MEMLOCK, &original), 0);
  if (original.rlim_max != RLIM_INFINITY && original.rlim_max < lowered) {
    GTEST_SKIP() << "hard RLIMIT_MEMLOCK is below " << lowered;
  }
  {
    MemlockLimitGuard guard(lowered);
    const std::size_t seen = memlock_limit_bytes();
    if (exempt_from_memlock()) {
      EXPECT_EQ(seen, kUnlimited) << "CAP_IPC_LOCK exempts this process from RLIMIT_MEMLOCK";
    } else {
      EXPECT_EQ(seen, lowered);
    }

    FakeLocker fake;
    {
      // No GPU: the buffer falls back for that reason, not for the limit (which would not help).
      fake.unavailable("no GPU in this test");
      WarningCapture warnings;
      PinnedBuffer buffer(kMiB, PinOptions{.locker = fake.locker()});
      EXPECT_FALSE(buffer.is_pinned());
      const std::vector<std::string> messages = warnings.messages();
      ASSERT_EQ(messages.size(), 1u);
      EXPECT_TRUE(contains(messages[0], "no GPU in this test")) << messages[0];
      EXPECT_FALSE(contains(messages[0], "RLIMIT_MEMLOCK")) << messages[0];
      fake.unavailable(std::nullopt);
    }
    WarningCapture warnings;
    PinnedBuffer buffer(kMiB, PinOptions{.locker = fake.locker()});
    const std::vector<std::string> messages = warnings.messages();
    if (seen != kUnlimited) {
      EXPECT_FALSE(buffer.is_pinned());
      ASSERT_EQ(messages.size(), 1u);
      EXPECT_TRUE(contains(messages[0], "RLIMIT_MEMLOCK")) << messages[0];
      EXPECT_TRUE(contains(messages[0], std::to_string(lowered))) << messages[0];
      EXPECT_TRUE(contains(messages[0], "ulimit -l unlimited")) << messages[0];

      WarningCapture unchecked_warnings;
      PinnedBuffer unchecked(kMiB, PinOptions{.locker = fake.locker(), .check_memlock = false});
      EXPECT_TRUE(unchecked.is_pinned()) << unchecked.fallback_reason();
    } else {
      EXPECT_TRUE(buffer.is_pinned()) << buffer.fallback_reason();
      EXPECT_TRUE(messages.empty());
    }
  }
  rlimit restored{};
  ASSERT_EQ(::getrlimit(RLIMIT_MEMLOCK, &restored), 0);
  EXPECT_EQ(restored.rlim_cur, original.rlim_cur);
}

// Where this process is exempt (CAP_IPC_LOCK, as root here), a forked child drops the
// capability so the limit itself is read and reported.
TEST(PinPrecheck, ChildWithoutCapIpcLockSeesTheLoweredLimit) {
  const rlim_t lowered = 64 * 1024;
  rlimit original{};
  ASSERT_EQ(::getrlimit(RLIMIT_MEMLOCK, &original), 0);
  if (original.rlim_max != RLIM_INFINITY && original.rlim_max < lowered) {
    GTEST_SKIP() << "hard RLIMIT_MEMLOCK is below " << lowered;
  }
  const pid_t child = ::fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {  // no gtest assertions here: report through the exit status
    rlimit limit = original;
    limit.rlim_cur = lowered;
    if (::setrlimit(RLIMIT_MEMLOCK, &limit) != 0) ::_exit(10);
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[2] = {};
    if (::syscall(SYS_capget, &header, data) != 0) ::_exit(11);
    data[0].effective &= ~(1u << CAP_IPC_LOCK);
    if (::syscall(SYS_capset, &header, data) != 0) ::_exit(12);
    if (memlock_limit_bytes() != lowered) ::_exit(13);
    const std::optional<std::string> reason =
        pin_precheck(kMiB, memlock_limit_bytes(), host_available_bytes(), 0);
    if (!reason || !contains(*reason, std::to_string(lowered))) ::_exit(14);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "10: setrlimit, 11/12: capget/capset, 13: memlock_limit_bytes() did not return the "
         "lowered limit, 14: the precheck message does not name it";
}

TEST(WarningSink, DefaultIsStderrAndSinksAreReplaceable) {
  testing::internal::CaptureStderr();
  emit_warning("hello from the test");
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(err, "warning: hello from the test")) << err;

  std::vector<std::string> seen;
  WarningSink previous = set_warning_sink([&](const std::string& m) { seen.push_back(m); });
  emit_warning("one");
  set_warning_sink([](const std::string&) { throw std::runtime_error("sink failed"); });
  EXPECT_NO_THROW(emit_warning("two"));
  set_warning_sink(std::move(previous));
  EXPECT_EQ(seen, std::vector<std::string>{"one"});
}

TEST(NumaNodeOfGpu, ReadsSysfsForEveryBusIdSpelling) {
  namespace fs = std::filesystem;
  char pattern[] = "/tmp/zo_sysfs_XXXXXX";
  ASSERT_NE(::mkdtemp(pattern), nullptr);
  const fs::path root = pattern;
  const auto device = [&](const std::string& id, const std::string& node) {
    fs::create_directories(root / "bus/pci/devices" / id);
    std::ofstream(root / "bus/pci/devices" / id / "numa_node") << node << "\n";
  };
  device("0000:3b:00.0", "1");
  device("0000:af:00.0", "-1");  // firmware without NUMA information
  device("10000:01:00.0", "3");  // a VMD domain has five digits
  const std::string sysfs = root.string();

  EXPECT_EQ(numa_node_of_gpu("0000:3b:00.0", sysfs), 1);
  EXPECT_EQ(numa_node_of_gpu("0000:3B:00.0", sysfs), 1);      // cudaDeviceGetPCIBusId
  EXPECT_EQ(numa_node_of_gpu("00000000:3B:00.0", sysfs), 1);  // nvidia-smi
  EXPECT_EQ(numa_node_of_gpu("3b:00.0", sysfs), 1);           // no domain
  EXPECT_EQ(numa_node_of_gpu(" 0000:3b:00.0\n", sysfs), 1);
  EXPECT_EQ(numa_node_of_gpu("00010000:01:00.0", sysfs), 3);
  EXPECT_EQ(numa_node_of_gpu("0000:af:00.0", sysfs), -1);
  EXPECT_EQ(numa_node_of_gpu("0000:5e:00.0", sysfs), -1);  // no such device
  EXPECT_EQ(numa_node_of_gpu("", sysfs), -1);
  EXPECT_EQ(numa_node_of_gpu("../../../etc", sysfs), -1);
  EXPECT_EQ(numa_node_of_gpu("0000:3b:00.0/../x", sysfs), -1);
  EXPECT_EQ(numa_node_of_gpu("0000:3b:0.0", sysfs), -1);
  fs::remove_all(root);
}

// ---- BucketRing ---------------------------------------------------------------------------------

TEST(BucketRing, RejectsZeroSlotsZeroBytesAndOverflow) {
  EXPECT_THROW(BucketRing(0, 1024), std::invalid_argument);
  EXPECT_THROW(BucketRing(4, 0), std::invalid_argument);
  EXPECT_THROW(BucketRing(std::numeric_limits<std::size_t>::max() / 2, 8192),
               std::invalid_argument);
  EXPECT_THROW(BucketRing(2, std::numeric_limits<std::size_t>::max()), std::invalid_argument);
}

TEST(BucketRing, HandsOutSlotsRoundRobinFromOneBuffer) {
  BucketRing ring(4, 1000, PinOptions{.enable = false});
  EXPECT_EQ(ring.slot_count(), 4u);
  EXPECT_EQ(ring.slot_bytes(), 1000u);
  EXPECT_EQ(ring.slot_stride(), 4096u);
  EXPECT_EQ(ring.pinned().size(), 4 * 4096u);
  EXPECT_FALSE(ring.pinned().is_pinned());
  const auto* base = static_cast<const std::byte*>(ring.pinned().data());

  std::vector<BucketRing::Slot> slots;
  for (std::size_t i = 0; i < 4; ++i) {
    slots.push_back(ring.acquire());
    EXPECT_EQ(slots.back().index(), i);
    EXPECT_EQ(slots.back().bytes(), 1000u);
    EXPECT_EQ(slots.back().data(), base + i * 4096);
    EXPECT_EQ(slots.back().span<float>().size(), 250u);
  }
  // Released out of order, reused in ring order.
  for (const std::size_t i : {2u, 0u, 3u, 1u})
    ring.release(slots[i]);
  for (std::size_t round = 0; round < 3; ++round) {
    for (std::size_t i = 0; i < 4; ++i) {
      BucketRing::Slot slot = ring.acquire();
      EXPECT_EQ(slot.index(), i) << "round " << round;
      ring.release(std::move(slot));
    }
  }
}

TEST(BucketRing, SingleSlotRingBlocksUntilReleased) {
  BucketRing ring(1, 64, PinOptions{.enable = false});
  BucketRing::Slot held = ring.acquire();
  std::atomic<bool> released{false};
  std::atomic<bool> acquired{false};
  std::thread waiter([&] {
    BucketRing::Slot slot = ring.acquire();
    EXPECT_TRUE(released.load()) << "acquire returned while the only slot was still held";
    EXPECT_EQ(slot.index(), 0u);
    acquired = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(acquired.load());
  released = true;
  ring.release(held);
  waiter.join();
  EXPECT_TRUE(acquired.load());
  EXPECT_FALSE(held);
}

TEST(BucketRing, SlotIsNotRewrittenWhileItsConsumerReadsIt) {
  // The engine's pattern: the producer fills a slot (a bucket copied down) and hands it to a
  // consumer thread (the accumulate thread), which reads it later and only then releases it. A
  // slot handed out again early would be overwritten while the consumer still reads it.
  constexpr std::size_t kSlots = 4;
  constexpr std::size_t kWords = 1024;
  constexpr std::uint32_t kBuckets = 3000;
  BucketRing ring(kSlots, kWords * sizeof(std::uint32_t), PinOptions{.warn = false});

  std::mutex mutex;
  std::condition_variable ready;
  std::deque<std::pair<BucketRing::Slot, std::uint32_t>> queue;
  std::atomic<int> corrupted{0};
  std::thread consumer([&] {
    std::mt19937 gen(5);
    for (std::uint32_t n = 0; n < kBuckets; ++n) {
      std::pair<BucketRing::Slot, std::uint32_t> item;
      {
        std::unique_lock<std::mutex> lock(mutex);
        ready.wait(lock, [&] { return !queue.empty(); });
        item = std::move(queue.front());
        queue.pop_front();
      }
      if (gen() % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      const auto words = item.first.span<std::uint32_t>();
      for (std::size_t j = 0; j < kWords; ++j) {
        if (words[j] != item.second * 7919u + j) {
          ++corrupted;
          break;
        }
      }
      ring.release(item.first);
    }
  });
  for (std::uint32_t bucket = 0; bucket < kBuckets; ++bucket) {
    BucketRing::Slot slot = ring.acquire();  // blocks while the consumer holds every slot
    ASSERT_EQ(slot.index(), bucket % kSlots);
    const auto words = slot.span<std::uint32_t>();
    for (std::size_t j = 0; j < kWords; ++j)
      words[j] = static_cast<std::uint32_t>(bucket * 7919u + j);
    {
      const std::lock_guard<std::mutex> lock(mutex);
      queue.emplace_back(std::move(slot), bucket);
    }
    ready.notify_one();
  }
  consumer.join();
  EXPECT_EQ(corrupted.load(), 0);
}

TEST(BucketRing, ManyThreadsNeverShareASlot) {
  constexpr std::size_t kSlots = 3;
  constexpr int kThreads = 4;
  constexpr int kIterations = 500;
  BucketRing ring(kSlots, 4096, PinOptions{.enable = false});
  std::vector<std::atomic<int>> holders(kSlots);
  std::atomic<int> errors{0};
  const auto worker = [&](int id) {
    for (int i = 0; i < kIterations; ++i) {
      BucketRing::Slot slot = ring.acquire();
      if (holders[slot.index()].fetch_add(1) != 0) ++errors;
      const auto tag = static_cast<std::uint8_t>(id * 17 + i);
      auto bytes = slot.span<std::uint8_t>();
      std::fill(bytes.begin(), bytes.end(), tag);
      std::this_thread::yield();
      if (!std::all_of(bytes.begin(), bytes.end(), [&](std::uint8_t v) { return v == tag; })) {
        ++errors;
      }
      holders[slot.index()].fetch_sub(1);
      if (i % 2 == 0) ring.release(slot);  // odd iterations: the Slot's destructor releases it
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back(worker, t);
  for (std::thread& t : threads)
    t.join();
  EXPECT_EQ(errors.load(), 0);
}

TEST(BucketRing, ReleaseChecksTheSlot) {
  BucketRing ring(2, 128, PinOptions{.enable = false});
  BucketRing other(2, 128, PinOptions{.enable = false});
  BucketRing::Slot mine = ring.acquire();
  BucketRing::Slot theirs = other.acquire();
  EXPECT_THROW(ring.release(theirs), std::invalid_argument);
  EXPECT_TRUE(theirs);  // still held, still usable
  other.release(theirs);
  EXPECT_FALSE(theirs);
  EXPECT_THROW(other.release(theirs), std::invalid_argument);  // already released
  BucketRing::Slot empty;
  EXPECT_THROW(ring.release(empty), std::invalid_argument);

  // Move-assigning over a held slot releases it.
  BucketRing::Slot next = ring.acquire();
  EXPECT_EQ(next.index(), 1u);
  mine = std::move(next);
  EXPECT_EQ(mine.index(), 1u);
  EXPECT_EQ(ring.acquire().index(), 0u);  // slot 0 was released by the assignment

  BucketRing moved(std::move(ring));
  EXPECT_THROW(ring.acquire(), std::logic_error);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(ring.slot_count(), 0u);                // NOLINT(bugprone-use-after-move)
  EXPECT_TRUE(ring.pinned().empty());              // NOLINT(bugprone-use-after-move)
  moved.release(mine);
}

TEST(BucketRing, SlotsKeepTheMemoryAliveAfterTheRing) {
  BucketRing::Slot survivor;
  {
    BucketRing ring(3, 512, PinOptions{.enable = false});
    ring.acquire();
    survivor = ring.acquire();
  }
  EXPECT_EQ(survivor.index(), 1u);
  std::memset(survivor.data(), 0x7f, survivor.bytes());  // ASan: still mapped
  survivor = BucketRing::Slot{};
}

TEST(BucketRing, WarnsOnceWhenItCannotPin) {
  WarningCapture warnings;
  BucketRing ring(8, kMiB);  // no locker
  EXPECT_FALSE(ring.pinned().is_pinned());
  EXPECT_EQ(warnings.messages().size(), 1u);
}

TEST(BucketRing, IsPinnedThroughItsLocker) {
  const std::size_t bytes = 4 * kMiB;
  if (pin_precheck(bytes, memlock_limit_bytes(), host_available_bytes())) {
    GTEST_SKIP() << "RLIMIT_MEMLOCK too low to pin " << bytes << " bytes";
  }
  FakeLocker fake;
  WarningCapture warnings;
  {
    BucketRing ring(4, kMiB, PinOptions{.locker = fake.locker()});
    EXPECT_TRUE(ring.pinned().is_pinned()) << ring.pinned().fallback_reason();
    EXPECT_EQ(fake::locks, 1) << "one buffer for all slots";
    EXPECT_TRUE(warnings.messages().empty());
  }
  EXPECT_EQ(fake::unlocks, 1);
}

}  // namespace
}  // namespace zo::pinned
