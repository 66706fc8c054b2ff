// gpu/ on its own: error checking, device discovery, the allocator, streams and events, the
// ZO_SYNC_EACH_OP check, page-locking (through pinned_memory's PinnedBuffer with gpu/'s CUDA
// locker), the cast kernel, NCCL, and cuBLASLt's loading. The first group runs everywhere; tests
// that need a usable GPU skip with the reason when there is none.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cublaslt_api.h"
#include "gpu/check.h"
#include "gpu/device.h"
#include "gpu/graph.h"
#include "gpu/nccl_comm.h"
#include "gpu/ops.h"
#include "gpu/runtime.h"
#include "gpu_test_device.h"
#include "pinned_memory/bucket_ring.h"
#include "pinned_memory/pinned_buffer.h"

namespace {

using zo::DType;
using zo::gpu::CudaError;
using zo::test::GpuBuffer;
using zo::test::test_pool;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

using zo::test::usable_device;

// ---- runs with or without a GPU ---------------------------------------------------------------

TEST(GpuDevice, QueryNeverThrowsAndExplainsAnEmptyResult) {
  std::vector<zo::gpu::DeviceInfo> devices;
  ASSERT_NO_THROW(devices = zo::gpu::query_devices());
  std::string reason;
  ASSERT_NO_THROW(reason = zo::gpu::no_device_reason());
  if (devices.empty()) {
    EXPECT_FALSE(reason.empty());
    EXPECT_TRUE(contains(reason, "--device host")) << reason;
  }
  bool any_usable = false;
  for (const zo::gpu::DeviceInfo& info : devices) {
    SCOPED_TRACE("device " + std::to_string(info.index) + " " + info.name);
    EXPECT_GE(info.index, 0);
    if (!info.usable()) continue;
    any_usable = true;
    EXPECT_FALSE(info.name.empty());
    EXPECT_GE(info.cc_major, zo::gpu::kMinComputeMajor);
    EXPECT_GT(info.sm_count, 0);
    EXPECT_GT(info.total_bytes, 0u);
    EXPECT_LE(info.free_bytes, info.total_bytes);
    // "domain:bus:device.function", the domain 4 or more hex digits.
    EXPECT_EQ(info.pci_bus_id.find(':'), info.pci_bus_id.size() - 8) << info.pci_bus_id;
  }
  EXPECT_EQ(reason.empty(), any_usable) << reason;

  // The count and the properties-only description agree with the full query.
  const zo::gpu::DeviceCount count = zo::gpu::count_devices();
  EXPECT_EQ(static_cast<std::size_t>(count.count), devices.size());
  for (const zo::gpu::DeviceInfo& info : devices) {
    const zo::gpu::DeviceInfo props = zo::gpu::describe_device(info.index);
    EXPECT_EQ(props.name, info.name);
    EXPECT_EQ(props.pci_bus_id, info.pci_bus_id);
    EXPECT_EQ(props.free_bytes, 0u) << "describe_device opens no context";
  }
  EXPECT_FALSE(zo::gpu::describe_device(-1).usable());
  EXPECT_FALSE(zo::gpu::describe_device(count.count).usable());
}

TEST(GpuDevice, RequireDeviceRejectsMissingDevices) {
  const std::size_t count = zo::gpu::query_devices().size();
  if (count == 0) {
    try {
      zo::gpu::require_device(0);
      FAIL() << "require_device(0) returned on a machine without a usable CUDA device";
    } catch (const std::runtime_error& e) {
      EXPECT_TRUE(contains(e.what(), "--device host")) << e.what();
    }
  } else {
    EXPECT_THROW(zo::gpu::require_device(-1), std::out_of_range);
    EXPECT_THROW(zo::gpu::require_device(static_cast<int>(count)), std::out_of_range);
  }
}

bool maps_cublaslt() {  // whether this process has libcublasLt mapped
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("libcublasLt") != std::string::npos) return true;
  return false;
}

// cuBLASLt is opened at its first use, not at the program's start, and then has every entry
// point gpu/ calls. Needs no GPU: opening the library and finding its symbols does not.
TEST(GpuCublasLt, OpensAtFirstUseWithEveryEntryPoint) {
  // Under ctest each test is a process of its own; a run of the whole binary may have made a
  // matmul context before.
  if (testing::UnitTest::GetInstance()->test_to_run_count() == 1) {
    EXPECT_FALSE(maps_cublaslt());
  }
  const zo::gpu::CublasLt& lt = zo::gpu::cublaslt();
#define ZO_EXPECT_ENTRY(name) EXPECT_NE(lt.name, nullptr) << #name;
  ZO_CUBLASLT_ENTRIES(ZO_EXPECT_ENTRY)
#undef ZO_EXPECT_ENTRY
  EXPECT_EQ(lt.cublasLtGetVersion() / 10000, std::size_t{CUBLAS_VER_MAJOR});
  EXPECT_STREQ(lt.cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED),
               "CUBLAS_STATUS_NOT_SUPPORTED");
#if defined(ZO_CUBLASLT_LINKED)
  EXPECT_FALSE(maps_cublaslt()) << "the emulator's build has its own cuBLASLt, linked in";
#else
  EXPECT_TRUE(maps_cublaslt());
#endif
  EXPECT_EQ(&zo::gpu::cublaslt(), &lt) << "opened once";
}

TEST(GpuCheck, FailingCallThrowsCudaErrorWithCallSiteAndErrorName) {
  int line = 0;
  try {
    line = __LINE__ + 1;
    ZO_CUDA_CHECK(cudaSetDevice(-1));
    FAIL() << "cudaSetDevice(-1) did not fail";
  } catch (const CudaError& e) {
    const std::string what = e.what();
    EXPECT_NE(e.code(), cudaSuccess);
    // With a GPU the ordinal is invalid; without one the runtime fails earlier (no driver/device).
    if (usable_device() >= 0) {
      EXPECT_EQ(e.code(), cudaErrorInvalidDevice);
    }
    EXPECT_TRUE(contains(what, "cudaSetDevice(-1)")) << what;
    EXPECT_TRUE(contains(what, "test_gpu.cpp:" + std::to_string(line))) << what;
    EXPECT_TRUE(contains(what, cudaGetErrorName(e.code()))) << what;
    EXPECT_TRUE(contains(what, cudaGetErrorString(e.code()))) << what;
  }
  EXPECT_NO_THROW(ZO_CUDA_CHECK(cudaSuccess));
}

TEST(GpuCast, RejectsBadArgumentsBeforeTouchingTheDevice) {
  alignas(16) std::byte host[64] = {};
  EXPECT_NO_THROW(zo::gpu::launch_cast(nullptr, DType::kF32, nullptr, DType::kF16, 0, nullptr));
  try {
    zo::gpu::launch_cast(nullptr, DType::kF32, host, DType::kF16, 5, nullptr);
    FAIL() << "null src accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "src is null")) << e.what();
    EXPECT_TRUE(contains(e.what(), "fp32 -> fp16")) << e.what();
  }
  EXPECT_THROW(zo::gpu::launch_cast(host, DType::kBF16, nullptr, DType::kF32, 1, nullptr),
               std::invalid_argument);
  // fp32 -> fp16 in place, or shifted by one element: the ranges overlap.
  EXPECT_THROW(zo::gpu::launch_cast(host, DType::kF32, host, DType::kF16, 8, nullptr),
               std::invalid_argument);
  EXPECT_THROW(zo::gpu::launch_cast(host, DType::kF16, host + 2, DType::kF16, 8, nullptr),
               std::invalid_argument);
  EXPECT_THROW(
      zo::gpu::launch_cast(host, static_cast<DType>(7), host + 32, DType::kF16, 1, nullptr),
      std::invalid_argument);
  // Same type onto itself is a no-op.
  EXPECT_NO_THROW(zo::gpu::launch_cast(host, DType::kBF16, host, DType::kBF16, 8, nullptr));
}

TEST(GpuMemoryPool, SizeClassesAndCapacityNeedNoDevice) {
  using zo::gpu::MemoryPool;
  EXPECT_EQ(MemoryPool::size_class(0), 512u);  // a distinct block even for 0 bytes
  EXPECT_EQ(MemoryPool::size_class(1000), 1024u);
  EXPECT_EQ(MemoryPool::size_class((1u << 20) - 1), std::size_t{1} << 20);
  EXPECT_EQ(MemoryPool::size_class((1u << 20) + 1), std::size_t{2} << 20);
  EXPECT_EQ(MemoryPool::size_class((std::size_t{3} << 20) + 1), std::size_t{4} << 20);
  EXPECT_THROW((void)MemoryPool::size_class(~std::size_t{0} - 5), std::length_error);

  // A request past the capacity is refused before the device is touched, naming it.
  MemoryPool pool(usable_device() < 0 ? 0 : usable_device(), std::size_t{1} << 20);
  try {
    (void)pool.allocate(std::size_t{3} << 20, "the big one");
    FAIL() << "allocated past the capacity";
  } catch (const zo::OutOfMemoryError& e) {
    EXPECT_EQ(e.requested(), std::size_t{3} << 20);
    EXPECT_EQ(e.capacity(), std::size_t{1} << 20);
    EXPECT_EQ(e.in_use(), 0u);
    EXPECT_TRUE(contains(e.what(), "the big one")) << e.what();
  }
  EXPECT_THROW(pool.reserve(std::size_t{2} << 20, "scratch"), zo::OutOfMemoryError);
  pool.reserve(1000, "scratch");
  EXPECT_EQ(pool.in_use(), 1000u);
  pool.unreserve(1000);
  EXPECT_EQ(pool.in_use(), 0u);
}

TEST(GpuSyncEachOp, ReadsTheSwitchFromTheEnvironment) {
  const char* saved = std::getenv("ZO_SYNC_EACH_OP");
  const std::string old = saved != nullptr ? saved : "";
  ::unsetenv("ZO_SYNC_EACH_OP");
  EXPECT_FALSE(zo::gpu::sync_each_op_requested());
  for (const char* off : {"", "0"}) {
    ::setenv("ZO_SYNC_EACH_OP", off, 1);
    EXPECT_FALSE(zo::gpu::sync_each_op_requested()) << '"' << off << '"';
  }
  for (const char* on : {"1", "yes"}) {
    ::setenv("ZO_SYNC_EACH_OP", on, 1);
    EXPECT_TRUE(zo::gpu::sync_each_op_requested()) << on;
  }
  if (saved != nullptr) {
    ::setenv("ZO_SYNC_EACH_OP", old.c_str(), 1);
  } else {
    ::unsetenv("ZO_SYNC_EACH_OP");
  }
}

// ---- needs a GPU ------------------------------------------------------------------------------

class GpuTest : public testing::Test {
 protected:
  void SetUp() override {
    if (usable_device() < 0) GTEST_SKIP() << "needs a CUDA GPU: " << zo::gpu::no_device_reason();
    zo::gpu::require_device(usable_device());
  }
};

zo::gpu::Stream make_stream() {
  return zo::gpu::Stream(usable_device(), test_pool());
}

TEST_F(GpuTest, CheckLaunchReportsAndThenClearsThePendingError) {
  (void)cudaSetDevice(-1);  // leaves cudaErrorInvalidDevice in the last-error slot
  try {
    ZO_CUDA_CHECK_LAUNCH();
    FAIL() << "pending error not reported";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.code(), cudaErrorInvalidDevice);
    EXPECT_TRUE(contains(e.what(), "kernel launch")) << e.what();
  }
  EXPECT_THROW(ZO_CUDA_CHECK(cudaSetDevice(-1)), CudaError);
  // The throw above consumed the error, so it is not blamed on the next launch.
  EXPECT_NO_THROW(ZO_CUDA_CHECK_LAUNCH());
}

// ZO_SYNC_EACH_OP's check names the op, the error and the switch; without a failure it only waits.
TEST_F(GpuTest, CheckOpFinishedNamesTheFailingOp) {
  zo::gpu::Stream s = make_stream();
  EXPECT_NO_THROW(zo::gpu::check_op_finished("gelu_forward", s.get()));
  (void)cudaSetDevice(-1);  // leaves cudaErrorInvalidDevice in the last-error slot, as a bad launch
  try {
    zo::gpu::check_op_finished("layernorm_backward", s.get());
    FAIL() << "pending error not reported";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.code(), cudaErrorInvalidDevice);
    for (const char* part : {"op layernorm_backward failed on the GPU", "cudaErrorInvalidDevice",
                             "ZO_SYNC_EACH_OP=1"}) {
      EXPECT_TRUE(contains(e.what(), part)) << e.what();
    }
  }
  EXPECT_NO_THROW(ZO_CUDA_CHECK_LAUNCH());  // consumed
}

TEST_F(GpuTest, StreamsAndEventsMoveAndOrderWork) {
  std::vector<std::uint8_t> pattern(4099);
  for (std::size_t i = 0; i < pattern.size(); ++i)
    pattern[i] = static_cast<std::uint8_t>(i * 7);
  GpuBuffer a(pattern.size()), b(pattern.size());

  zo::gpu::Stream first = make_stream();
  const cudaStream_t raw = first.get();
  zo::gpu::Stream s1(std::move(first));
  EXPECT_EQ(first.get(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is the API
  EXPECT_EQ(s1.get(), raw);
  zo::gpu::Stream s2 = make_stream();
  zo::gpu::Event start(usable_device()), done(usable_device()), never(usable_device());
  zo::gpu::Event moved(std::move(done));
  EXPECT_EQ(done.get(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_TRUE(never.query());      // never recorded: complete
  never.synchronize();
  EXPECT_THROW((void)moved.elapsed_ms_since(never), std::logic_error);

  start.record(s1);
  s1.copy(a.data(), pattern.data(), pattern.size(), cudaMemcpyHostToDevice);
  moved.record(s1);
  s2.wait(moved);  // s2's copy must see s1's upload
  s2.copy(b.data(), a.data(), pattern.size(), cudaMemcpyDeviceToDevice);
  s2.fill_zero(b.as<std::uint8_t>() + 10, 5);
  std::vector<std::uint8_t> back(pattern.size());
  s2.copy(back.data(), b.data(), back.size(), cudaMemcpyDeviceToHost);
  s2.synchronize();
  std::vector<std::uint8_t> expect = pattern;
  std::fill_n(expect.begin() + 10, 5, std::uint8_t{0});
  EXPECT_EQ(back, expect);
  EXPECT_TRUE(moved.query());
  EXPECT_GE(moved.elapsed_ms_since(start), 0.0);
  EXPECT_THROW(s1.copy(nullptr, pattern.data(), 1, cudaMemcpyHostToDevice), std::invalid_argument);
  EXPECT_THROW(s1.fill_zero(nullptr, 1), std::invalid_argument);

  // The per-stream scratch is accounted in the pool while the stream lives.
  const auto pool = std::make_shared<zo::gpu::MemoryPool>(usable_device(), std::size_t{64} << 20);
  {
    zo::gpu::Stream s(usable_device(), pool);
    void* block = nullptr;
    s.with_scratch(4000, "test scratch", [&](void* p) { block = p; });
    EXPECT_NE(block, nullptr);
    EXPECT_EQ(pool->in_use(), zo::gpu::MemoryPool::size_class(4000));
    // It persists: a request it already covers gets the same block, no allocation.
    s.with_scratch(100, "test scratch", [&](void* p) { EXPECT_EQ(p, block); });
    EXPECT_EQ(pool->in_use(), zo::gpu::MemoryPool::size_class(4000));
    s.with_scratch(40000, "test scratch", [](void* p) { EXPECT_NE(p, nullptr); });
    EXPECT_EQ(pool->in_use(), zo::gpu::MemoryPool::size_class(40000));
    EXPECT_THROW(s.with_scratch(std::size_t{128} << 20, "too much scratch", [](void*) {}),
                 zo::OutOfMemoryError);
  }
  EXPECT_EQ(pool->in_use(), 0u);
}

// A graph records without running and replays in stream order, as often as it is launched,
// reading memory as it is at replay; the stream works eagerly in between. The recording goes
// stale once the stream's scratch moves.
TEST_F(GpuTest, GraphsRecordOnceAndReplayInStreamOrder) {
  const std::size_t n = 1001;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  auto values = [&] {
    std::vector<float> x(n);
    for (float& v : x)
      v = u(rng);
    return x;
  };
  auto as_bf16 = [&](const std::vector<float>& x) {
    std::vector<std::uint16_t> r(n);
    for (std::size_t i = 0; i < n; ++i)
      r[i] = zo::float_to_bf16(x[i]);
    return r;
  };
  GpuBuffer src(n * 4), dst(n * 2);
  zo::gpu::Stream s = make_stream();
  std::vector<std::uint16_t> back(n), zeros(n, 0);
  auto read_dst = [&] {
    s.copy(back.data(), dst.data(), n * 2, cudaMemcpyDeviceToHost);
    s.synchronize();
    return back;
  };
  const std::vector<float> x1 = values(), x2 = values();
  s.copy(src.data(), x1.data(), n * 4, cudaMemcpyHostToDevice);
  s.fill_zero(dst.data(), n * 2);
  s.with_scratch(256, "test scratch", [](void*) {});
  zo::gpu::Graph g = zo::gpu::Graph::capture(s, [&] {
    zo::gpu::launch_cast(src.data(), DType::kF32, dst.data(), DType::kBF16, n, s.get());
  });
  EXPECT_FALSE(s.capturing());
  EXPECT_EQ(read_dst(), zeros) << "the recording ran";
  g.launch();
  EXPECT_EQ(read_dst(), as_bf16(x1));
  s.copy(src.data(), x2.data(), n * 4, cudaMemcpyHostToDevice);
  s.fill_zero(dst.data(), n * 2);
  g.launch();  // after the eager copy and fill, in stream order
  EXPECT_EQ(read_dst(), as_bf16(x2));
  EXPECT_TRUE(g.current());
  s.with_scratch(std::size_t{1} << 20, "test scratch", [](void*) {});
  EXPECT_FALSE(g.current()) << "the scratch moved";
}

// What a recording cannot hold fails the capture with the reason, and leaves the stream usable.
TEST_F(GpuTest, GraphCaptureRefusesSynchronisationAndScratchGrowth) {
  zo::gpu::Stream s = make_stream();
  GpuBuffer a(64);
  try {
    (void)zo::gpu::Graph::capture(s, [&] { s.synchronize(); });
    FAIL() << "a synchronisation was recorded";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.code(), cudaErrorStreamCaptureUnsupported) << e.what();
  }
  EXPECT_FALSE(s.capturing());
  try {
    (void)zo::gpu::Graph::capture(s, [&] { s.with_scratch(4096, "grown scratch", [](void*) {}); });
    FAIL() << "the scratch grew in a recording";
  } catch (const std::logic_error& e) {
    EXPECT_TRUE(contains(e.what(), "grown scratch")) << e.what();
    EXPECT_TRUE(contains(e.what(), "graph is being captured")) << e.what();
  }
  EXPECT_FALSE(s.capturing());
  EXPECT_THROW((void)zo::gpu::Graph::capture(s, [] { throw std::runtime_error("from fn"); }),
               std::runtime_error);
  const std::vector<std::uint8_t> ones(64, 1);
  std::vector<std::uint8_t> back(64);
  s.copy(a.data(), ones.data(), 64, cudaMemcpyHostToDevice);
  s.copy(back.data(), a.data(), 64, cudaMemcpyDeviceToHost);
  s.synchronize();
  EXPECT_EQ(back, ones);
}

TEST_F(GpuTest, OversizedAllocationNamesTheRequest) {
  constexpr std::size_t kPiB = std::size_t{1} << 50;
  try {
    (void)test_pool()->allocate(kPiB, "a petabyte");
    FAIL() << "allocated 1 PiB";
  } catch (const zo::OutOfMemoryError& e) {
    EXPECT_EQ(e.requested(), kPiB);
    EXPECT_TRUE(contains(e.what(), "a petabyte")) << e.what();
    EXPECT_TRUE(contains(e.what(), std::to_string(kPiB))) << e.what();
    EXPECT_TRUE(contains(e.what(), "1.00 PiB")) << e.what();
    EXPECT_TRUE(contains(e.what(), "cudaMalloc failed")) << e.what();
  }
  // The failure is not left behind for the next check, and the device still works.
  EXPECT_NO_THROW(ZO_CUDA_CHECK_LAUNCH());
  GpuBuffer small(256);
  EXPECT_NE(small.data(), nullptr);
}

// ---- cast: every element is stored as raw bits (fp32 bits, or 16-bit bits in the low half) ----

std::size_t size_of(DType t) {
  return t == DType::kF32 ? 4 : 2;
}

float host_to_float(DType t, std::uint32_t bits) {
  switch (t) {
    case DType::kF32:
      return std::bit_cast<float>(bits);
    case DType::kF16:
      return zo::half_to_float(static_cast<std::uint16_t>(bits));
    case DType::kBF16:
      return zo::bf16_to_float(static_cast<std::uint16_t>(bits));
  }
  return 0.0f;
}

std::uint32_t host_from_float(DType t, float x) {
  switch (t) {
    case DType::kF32:
      return std::bit_cast<std::uint32_t>(x);
    case DType::kF16:
      return zo::float_to_half(x);
    case DType::kBF16:
      return zo::float_to_bf16(x);
  }
  return 0;
}

bool is_nan(DType t, std::uint32_t bits) {
  switch (t) {
    case DType::kF32:
      return (bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0;
    case DType::kF16:
      return (bits & 0x7c00u) == 0x7c00u && (bits & 0x03ffu) != 0;
    case DType::kBF16:
      return (bits & 0x7f80u) == 0x7f80u && (bits & 0x007fu) != 0;
  }
  return false;
}

std::uint32_t float_bits(std::uint32_t sign, std::uint32_t exponent_field, std::uint32_t mantissa) {
  return (sign << 31) | (exponent_field << 23) | (mantissa & 0x7fffffu);
}

// fp32 inputs spanning every case the rounding has to get right.
std::vector<std::uint32_t> make_f32_inputs(std::size_t n, std::mt19937& rng) {
  static const std::uint32_t kSpecials[] = {
      0x00000000u, 0x80000000u,               // +-0
      0x7f800000u, 0xff800000u,               // +-inf
      0x7fc00000u, 0xffc00000u, 0x7f800001u,  // quiet NaNs, a signalling NaN
      0x7fbfffffu,                            // signalling NaN with a full payload
      0x477fe000u,                            // 65504, fp16 max
      0x477fefffu, 0x477ff000u, 0xc77ff000u,  // just below / at the fp16 overflow tie
      0x7f7fffffu, 0xff7fffffu,               // fp32 max: bf16 rounds it to inf
      0x33800000u, 0x33000000u, 0x33000001u,  // 2^-24 (fp16 min subnormal), 2^-25 tie, above
      0x38800000u, 0x387fc000u,               // fp16 min normal, largest fp16 subnormal
      0x00800000u, 0x00000001u, 0x807fffffu,  // fp32 min normal and subnormals
      0x3f801000u, 0x3f803000u,               // fp16 ties to even: down, up
      0x3f808000u, 0x3f818000u,               // bf16 ties to even: down, up
  };
  std::uniform_int_distribution<std::uint32_t> any;
  std::uniform_int_distribution<std::uint32_t> category(0, 6);
  std::vector<std::uint32_t> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t sign = any(rng) & 1u;
    const std::uint32_t mantissa = any(rng);
    const auto in_range = [&](std::uint32_t lo, std::uint32_t hi) {
      return std::uniform_int_distribution<std::uint32_t>(lo, hi)(rng);
    };
    switch (category(rng)) {
      case 0:
        out[i] = kSpecials[in_range(0, static_cast<std::uint32_t>(std::size(kSpecials) - 1))];
        break;
      case 1:  // any bit pattern
        out[i] = any(rng);
        break;
      case 2:  // fp16 normal range, 2^-14 .. 2^15
        out[i] = float_bits(sign, in_range(127 - 14, 127 + 15), mantissa);
        break;
      case 3:  // fp16 subnormal range and below
        out[i] = float_bits(sign, in_range(127 - 26, 127 - 15), mantissa);
        break;
      case 4:  // beyond fp16 (inf there), up to bf16 overflow
        out[i] = float_bits(sign, in_range(127 + 16, 254), mantissa);
        break;
      case 5:  // fp32 subnormals
        out[i] = float_bits(sign, 0, mantissa);
        break;
      default:  // exact ties for fp16 (13 dropped bits) or bf16 (16 dropped bits)
        out[i] = float_bits(
            sign, in_range(127 - 30, 127 + 30),
            (any(rng) & 1u) ? (mantissa & ~0x1fffu) | 0x1000u : (mantissa & ~0xffffu) | 0x8000u);
        break;
    }
  }
  return out;
}

// 16-bit inputs: every pattern once when n allows, random ones after.
std::vector<std::uint32_t> make_16bit_inputs(std::size_t n, std::mt19937& rng) {
  std::vector<std::uint32_t> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = n >= 65536 && i < 65536 ? static_cast<std::uint32_t>(i)
                                     : static_cast<std::uint32_t>(rng() & 0xffffu);
  }
  return out;
}

std::vector<std::byte> to_bytes(DType t, const std::vector<std::uint32_t>& bits) {
  std::vector<std::byte> bytes(bits.size() * size_of(t));
  for (std::size_t i = 0; i < bits.size(); ++i) {
    if (t == DType::kF32) {
      std::memcpy(&bytes[i * 4], &bits[i], 4);
    } else {
      const auto half = static_cast<std::uint16_t>(bits[i]);
      std::memcpy(&bytes[i * 2], &half, 2);
    }
  }
  return bytes;
}

std::vector<std::uint32_t> from_bytes(DType t, const std::vector<std::byte>& bytes) {
  std::vector<std::uint32_t> bits(bytes.size() / size_of(t));
  for (std::size_t i = 0; i < bits.size(); ++i) {
    if (t == DType::kF32) {
      std::memcpy(&bits[i], &bytes[i * 4], 4);
    } else {
      std::uint16_t half = 0;
      std::memcpy(&half, &bytes[i * 2], 2);
      bits[i] = half;
    }
  }
  return bits;
}

// Runs launch_cast with src and dst placed `src_offset` / `dst_offset` elements into their
// buffers (a non-zero offset breaks 16-byte alignment and takes the scalar path).
std::vector<std::uint32_t> cast_on_device(const std::vector<std::uint32_t>& in, DType src_t,
                                          DType dst_t, std::size_t src_offset = 0,
                                          std::size_t dst_offset = 0) {
  const std::size_t n = in.size();
  const std::size_t src_size = size_of(src_t);
  const std::size_t dst_size = size_of(dst_t);
  GpuBuffer src((n + src_offset) * src_size);
  GpuBuffer dst((n + dst_offset) * dst_size);
  const std::vector<std::byte> in_bytes = to_bytes(src_t, in);
  src.copy_from_host(in_bytes.data(), in_bytes.size(), src_offset * src_size);
  zo::gpu::Stream stream = make_stream();
  zo::gpu::launch_cast(src.as<std::byte>() + src_offset * src_size, src_t,
                       dst.as<std::byte>() + dst_offset * dst_size, dst_t, n, stream.get());
  stream.synchronize();
  std::vector<std::byte> out_bytes(n * dst_size);
  dst.copy_to_host(out_bytes.data(), out_bytes.size(), dst_offset * dst_size);
  return from_bytes(dst_t, out_bytes);
}

// Equal bits, except that NaN only has to stay NaN (payloads differ between converters). A
// same-type copy must keep every bit, NaN payloads included.
testing::AssertionResult same_values(DType src_t, DType dst_t, const std::vector<std::uint32_t>& in,
                                     const std::vector<std::uint32_t>& expected,
                                     const std::vector<std::uint32_t>& got) {
  std::size_t mismatches = 0;
  std::string first;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const bool ok = src_t != dst_t && is_nan(dst_t, expected[i]) ? is_nan(dst_t, got[i])
                                                                 : got[i] == expected[i];
    if (ok) continue;
    if (mismatches++ < 5) {
      char line[128];
      std::snprintf(line, sizeof line, "\n  [%zu] in 0x%08x: expected 0x%08x, got 0x%08x", i, in[i],
                    expected[i], got[i]);
      first += line;
    }
  }
  if (mismatches == 0) return testing::AssertionSuccess();
  return testing::AssertionFailure()
         << mismatches << " of " << expected.size() << " elements differ:" << first;
}

constexpr DType kTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

TEST_F(GpuTest, CastMatchesHostConvertersBitForBit) {
  std::mt19937 rng(20240611);
  const std::size_t sizes[] = {1, 7, 8, 9, 4099, 65536, 1000003};
  const std::pair<std::size_t, std::size_t> offsets[] = {{0, 0}, {1, 0}, {0, 1}, {3, 5}};
  for (const DType src_t : kTypes) {
    for (const DType dst_t : kTypes) {
      for (const std::size_t n : sizes) {
        const std::vector<std::uint32_t> in =
            src_t == DType::kF32 ? make_f32_inputs(n, rng) : make_16bit_inputs(n, rng);
        std::vector<std::uint32_t> expected(n);
        for (std::size_t i = 0; i < n; ++i) {
          expected[i] =
              src_t == dst_t ? in[i] : host_from_float(dst_t, host_to_float(src_t, in[i]));
        }
        for (const auto& [src_offset, dst_offset] : offsets) {
          SCOPED_TRACE(std::string(zo::dtype_name(src_t)) + " -> " +
                       std::string(zo::dtype_name(dst_t)) + ", n " + std::to_string(n) +
                       ", offsets " + std::to_string(src_offset) + "/" +
                       std::to_string(dst_offset));
          const std::vector<std::uint32_t> got =
              cast_on_device(in, src_t, dst_t, src_offset, dst_offset);
          ASSERT_TRUE(same_values(src_t, dst_t, in, expected, got));
        }
      }
    }
  }
}

TEST_F(GpuTest, SixteenBitValuesSurviveTheTripThroughFp32) {
  std::mt19937 rng(7);
  const std::vector<std::uint32_t> all = make_16bit_inputs(65536, rng);
  for (const DType t : {DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(std::string(zo::dtype_name(t)));
    const std::vector<std::uint32_t> wide = cast_on_device(all, t, DType::kF32);
    for (std::size_t i = 0; i < all.size(); ++i) {
      // Widening is exact: the same value as the host widens to (NaN: still NaN).
      const std::uint32_t host = std::bit_cast<std::uint32_t>(host_to_float(t, all[i]));
      if (is_nan(t, all[i])) {
        ASSERT_TRUE(is_nan(DType::kF32, wide[i])) << i;
      } else {
        ASSERT_EQ(wide[i], host) << i;
      }
    }
    const std::vector<std::uint32_t> back = cast_on_device(wide, DType::kF32, t);
    ASSERT_TRUE(same_values(DType::kF32, t, wide, all, back));
  }
}

}  // namespace

// ---- NCCL (data parallelism on GPUs) ------------------------------------------------------------

namespace {

// The single-rank NCCL path the engine uses: init from a unique id, then reduce-scatter and
// all-gather of one rank are exact copies (fp32 and bf16 words, odd count).
TEST(Nccl, SingleRankCollectivesAreExactCopies) {
  if (usable_device() < 0) GTEST_SKIP() << "needs a CUDA GPU: " << zo::gpu::no_device_reason();
  if (!zo::gpu::nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  zo::gpu::NcclComm comm(zo::gpu::NcclComm::unique_id(), 0, 1, usable_device(), 60.0);
  EXPECT_EQ(comm.size(), 1);
  cudaStream_t s = nullptr;  // a blocking stream: ordered after the synchronous copies below
  ZO_CUDA_CHECK(cudaStreamCreate(&s));
  std::mt19937 rng(5);
  std::normal_distribution<float> value(0.0f, 3.0f);
  for (const DType d : {DType::kF32, DType::kBF16}) {
    const std::size_t n = 1001, bytes = n * zo::dtype_size(d);
    std::vector<unsigned char> host(bytes), back(bytes);
    for (std::size_t i = 0; i < n; ++i) {  // finite values; bf16 keeps a float's high half
      const auto w = std::bit_cast<std::uint32_t>(value(rng));
      if (d == DType::kF32) {
        std::memcpy(host.data() + 4 * i, &w, 4);
      } else {
        const auto h = static_cast<std::uint16_t>(w >> 16);
        std::memcpy(host.data() + 2 * i, &h, 2);
      }
    }
    GpuBuffer in(bytes), out(bytes);
    ZO_CUDA_CHECK(cudaMemcpy(in.data(), host.data(), bytes, cudaMemcpyHostToDevice));
    comm.reduce_scatter(in.data(), out.data(), n, d, s);
    ZO_CUDA_CHECK(cudaStreamSynchronize(s));
    ZO_CUDA_CHECK(cudaMemcpy(back.data(), out.data(), bytes, cudaMemcpyDeviceToHost));
    EXPECT_EQ(back, host) << "reduce_scatter " << zo::dtype_name(d);
    ZO_CUDA_CHECK(cudaMemset(out.data(), 0, bytes));
    comm.all_gather(in.data(), out.data(), n, d, s);
    ZO_CUDA_CHECK(cudaStreamSynchronize(s));
    ZO_CUDA_CHECK(cudaMemcpy(back.data(), out.data(), bytes, cudaMemcpyDeviceToHost));
    EXPECT_EQ(back, host) << "all_gather " << zo::dtype_name(d);
  }
  ZO_CUDA_CHECK(cudaStreamDestroy(s));
}

}  // namespace

// ---- page-locking: pinned_memory's PinnedBuffer with gpu/'s CUDA locker ------------------------

namespace {

using zo::pinned::PinnedBuffer;
using zo::pinned::PinOptions;

constexpr std::size_t kMiB = std::size_t{1} << 20;

// What the trainer passes (src/device/make_device.cpp, staging_pin_options).
PinOptions cuda_pin(bool warn = true) {
  PinOptions o;
  o.locker = {&zo::gpu::page_lock_unavailable_reason, &zo::gpu::page_lock, &zo::gpu::page_unlock};
  o.warn = warn;
  return o;
}

// Collects warnings for the lifetime of the object, then restores the previous sink.
class WarningCapture {
 public:
  WarningCapture()
      : previous_(zo::pinned::set_warning_sink(
            [this](const std::string& m) { messages_.push_back(m); })) {}
  ~WarningCapture() { zo::pinned::set_warning_sink(std::move(previous_)); }
  WarningCapture(const WarningCapture&) = delete;
  WarningCapture& operator=(const WarningCapture&) = delete;
  const std::vector<std::string>& messages() const { return messages_; }

 private:
  std::vector<std::string> messages_;
  zo::pinned::WarningSink previous_;
};

bool fits_memlock(std::size_t bytes) {
  return !zo::pinned::pin_precheck(bytes, zo::pinned::memlock_limit_bytes(),
                                   zo::pinned::host_available_bytes());
}

TEST(CudaPageLocking, FallsBackWithTheProbesReasonWithoutGpu) {
  const std::optional<std::string> reason = zo::pinned::pin_unavailable_reason(cuda_pin().locker);
  if (!reason) GTEST_SKIP() << "pinning works here: covered by CudaPageLocking.PinsWithGpu";
  EXPECT_TRUE(contains(*reason, "CUDA device")) << *reason;
  EXPECT_TRUE(contains(*reason, "--no-pin")) << *reason;
  EXPECT_EQ(reason, zo::gpu::page_lock_unavailable_reason().value() +
                        ", or pass --no-pin "
                        "(PinOptions::enable = false) to use pageable memory without this warning");
  {
    WarningCapture warnings;
    PinnedBuffer buffer(3 * kMiB, cuda_pin());
    EXPECT_FALSE(buffer.is_pinned());
    EXPECT_EQ(buffer.fallback_reason(), *reason);
    ASSERT_EQ(warnings.messages().size(), 1u);
    EXPECT_TRUE(contains(warnings.messages()[0], *reason)) << warnings.messages()[0];
    EXPECT_TRUE(contains(warnings.messages()[0], "pageable")) << warnings.messages()[0];
    EXPECT_EQ(zo::pinned::pinned_bytes_in_use(), 0u);
  }
  {
    WarningCapture warnings;
    PinnedBuffer quiet(kMiB, cuda_pin(/*warn=*/false));
    EXPECT_FALSE(quiet.is_pinned());
    EXPECT_EQ(quiet.fallback_reason(), *reason);
    EXPECT_TRUE(warnings.messages().empty());
  }
  zo::pinned::BucketRing ring(8, kMiB, cuda_pin());
  EXPECT_FALSE(ring.pinned().is_pinned());
}

TEST(CudaPageLocking, PinsWithGpu) {
  if (const auto why = zo::pinned::pin_unavailable_reason(cuda_pin().locker)) GTEST_SKIP() << *why;
  const std::size_t bytes = 8 * kMiB;
  WarningCapture warnings;
  const std::size_t before = zo::pinned::pinned_bytes_in_use();
  {
    // Placed on the GPU's NUMA node, as the trainer places its staging buffers.
    PinOptions o = cuda_pin();
    const std::string bus_id = zo::gpu::describe_device(std::max(usable_device(), 0)).pci_bus_id;
    o.placement = zo::pinned::placement_on_node(zo::pinned::numa_node_of_gpu(bus_id));
    PinnedBuffer buffer(bytes, o);
    if (!fits_memlock(bytes)) {  // a low RLIMIT_MEMLOCK without CAP_IPC_LOCK: the right fallback
      EXPECT_FALSE(buffer.is_pinned());
      EXPECT_TRUE(contains(buffer.fallback_reason(), "RLIMIT_MEMLOCK"));
      return;
    }
    EXPECT_TRUE(buffer.is_pinned()) << buffer.fallback_reason();
    EXPECT_TRUE(warnings.messages().empty());
    EXPECT_EQ(zo::pinned::pinned_bytes_in_use(), before + bytes);
    PinnedBuffer moved(std::move(buffer));
    EXPECT_TRUE(moved.is_pinned());
    EXPECT_FALSE(buffer.is_pinned());  // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(zo::pinned::pinned_bytes_in_use(), before + bytes);
    // Registered memory copies asynchronously (the emulator checks the registration too).
    GpuBuffer device(bytes);
    zo::gpu::Stream s = make_stream();
    std::memset(moved.data(), 0x3c, bytes);
    s.copy(device.data(), moved.data(), bytes, cudaMemcpyHostToDevice);
    s.synchronize();  // the copy is asynchronous: reuse the buffer only once it completed
    std::memset(moved.data(), 0, bytes);
    s.copy(moved.data(), device.data(), bytes, cudaMemcpyDeviceToHost);
    s.synchronize();
    EXPECT_EQ(moved.span<std::uint8_t>()[bytes - 1], 0x3c);
  }
  EXPECT_EQ(zo::pinned::pinned_bytes_in_use(), before);
  // Unchecked memlock still pins (the driver does not charge the limit); portable too.
  PinOptions unchecked = cuda_pin();
  unchecked.check_memlock = false;
  unchecked.portable = true;
  PinnedBuffer pinned(kMiB, unchecked);
  EXPECT_TRUE(pinned.is_pinned()) << pinned.fallback_reason();
  if (fits_memlock(4 * kMiB)) {
    zo::pinned::BucketRing ring(4, kMiB, cuda_pin());
    EXPECT_TRUE(ring.pinned().is_pinned()) << ring.pinned().fallback_reason();
  }
  EXPECT_TRUE(warnings.messages().empty());
}

TEST(CudaPageLocking, GpuBusIdLocatesItsNumaNode) {
  EXPECT_EQ(zo::pinned::numa_node_of_gpu(zo::gpu::describe_device(-1).pci_bus_id), -1);
  if (usable_device() < 0) GTEST_SKIP() << "needs a CUDA GPU: " << zo::gpu::no_device_reason();
  const std::string bus_id = zo::gpu::describe_device(usable_device()).pci_bus_id;
  EXPECT_FALSE(bus_id.empty());
  EXPECT_GE(zo::pinned::numa_node_of_gpu(bus_id), -1);
}

}  // namespace
