// gpu/: error checking, device discovery, device buffers and the cast kernel. The first group
// runs everywhere; tests that need a usable GPU skip with the reason when there is none.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "gpu/cast.h"
#include "gpu/check.h"
#include "gpu/device.h"
#include "gpu/device_buffer.h"
#include "gpu/nccl_comm.h"
#include "gpu_test_device.h"

namespace {

using zo::DType;
using zo::gpu::CudaError;
using zo::gpu::DeviceBuffer;

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

TEST(GpuDeviceBuffer, EmptyBuffersNeedNoDevice) {
  DeviceBuffer a;
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.device(), -1);
  DeviceBuffer b(0);
  EXPECT_TRUE(b.empty());
  DeviceBuffer c(std::move(b));
  EXPECT_TRUE(c.empty());
  a = std::move(c);
  EXPECT_TRUE(a.empty());
  std::byte byte{};
  EXPECT_THROW(a.copy_from_host(&byte, 1), std::out_of_range);
  EXPECT_THROW(a.copy_to_host(&byte, 1), std::out_of_range);
  EXPECT_NO_THROW(a.copy_from_host(nullptr, 0));
}

// ---- needs a GPU ------------------------------------------------------------------------------

class GpuTest : public testing::Test {
 protected:
  void SetUp() override {
    if (usable_device() < 0) GTEST_SKIP() << "needs a CUDA GPU: " << zo::gpu::no_device_reason();
    zo::gpu::require_device(usable_device());
  }
};

class Stream {
 public:
  Stream() { ZO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() { (void)cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void sync() const { ZO_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

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

TEST_F(GpuTest, DeviceBufferMovesOwnership) {
  std::vector<std::uint8_t> pattern(1000);
  for (std::size_t i = 0; i < pattern.size(); ++i)
    pattern[i] = static_cast<std::uint8_t>(i * 7);

  DeviceBuffer a(pattern.size());
  EXPECT_EQ(a.size(), pattern.size());
  EXPECT_EQ(a.device(), usable_device());
  a.copy_from_host(pattern.data(), pattern.size());
  void* const raw = a.data();

  DeviceBuffer b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is the API
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(b.data(), raw);
  EXPECT_EQ(b.as<std::uint8_t>(), static_cast<std::uint8_t*>(raw));

  DeviceBuffer c(64);  // its own memory is freed by the assignment
  c = std::move(b);
  EXPECT_EQ(b.data(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(c.data(), raw);
  DeviceBuffer& alias = c;
  c = std::move(alias);  // self-move keeps the memory
  EXPECT_EQ(c.data(), raw);

  std::vector<std::uint8_t> back(pattern.size());
  c.copy_to_host(back.data(), back.size());
  EXPECT_EQ(back, pattern);
  std::vector<std::uint8_t> tail(10);
  c.copy_to_host(tail.data(), tail.size(), 990);
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), pattern.begin() + 990));
  EXPECT_THROW(c.copy_to_host(tail.data(), tail.size(), 991), std::out_of_range);
  c.reset();
  EXPECT_TRUE(c.empty());
}

TEST_F(GpuTest, OversizedAllocationNamesTheRequest) {
  constexpr std::size_t kPiB = std::size_t{1} << 50;
  try {
    DeviceBuffer huge(kPiB);
    FAIL() << "allocated 1 PiB";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.code(), cudaErrorMemoryAllocation);
    EXPECT_TRUE(contains(e.what(), std::to_string(kPiB))) << e.what();
    EXPECT_TRUE(contains(e.what(), "1.00 PiB")) << e.what();
    EXPECT_TRUE(contains(e.what(), " free of ")) << e.what();
  }
  // The failure is not left behind for the next check, and the device still works.
  EXPECT_NO_THROW(ZO_CUDA_CHECK_LAUNCH());
  DeviceBuffer small(256);
  EXPECT_FALSE(small.empty());
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
  DeviceBuffer src((n + src_offset) * src_size);
  DeviceBuffer dst((n + dst_offset) * dst_size);
  const std::vector<std::byte> in_bytes = to_bytes(src_t, in);
  src.copy_from_host(in_bytes.data(), in_bytes.size(), src_offset * src_size);
  Stream stream;
  zo::gpu::launch_cast(src.as<std::byte>() + src_offset * src_size, src_t,
                       dst.as<std::byte>() + dst_offset * dst_size, dst_t, n, stream.get());
  stream.sync();
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

// ---- NCCL (data parallelism on GPUs, issue 6) -------------------------------------------------

namespace {

// The single-rank NCCL path the engine uses: init from a unique id, then reduce-scatter and
// all-gather of one rank are exact copies (fp32 and bf16 words, odd count).
TEST(Nccl, SingleRankCollectivesAreExactCopies) {
  if (usable_device() < 0) GTEST_SKIP() << "needs a CUDA GPU: " << zo::gpu::no_device_reason();
  if (!zo::gpu::nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  zo::gpu::NcclComm comm(zo::gpu::NcclComm::unique_id(), 0, 1, usable_device(), 60.0);
  EXPECT_EQ(comm.size(), 1);
  cudaStream_t s = nullptr;
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
    DeviceBuffer in(bytes), out(bytes);
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
