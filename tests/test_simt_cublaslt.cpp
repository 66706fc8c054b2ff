// Tests of the SIMT emulator's cuBLASLt (tests/simt/cublaslt_fake*.cpp) through the cublasLt API
// alone: GEMMs in every dtype and transpose against a float64 reference computed here from the
// stored inputs, the epilogues (BIAS, GELU_AUX(_BIAS), DGELU, BGRADB), in-place and beta = 0
// rules, the test hooks, and the statuses of refused calls.
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace zo::simt {  // test hooks, defined in cublaslt_fake.cpp
void cublaslt_refuse_bias_epilogue(bool refuse);
void cublaslt_refuse_epilogues(bool refuse);
void cublaslt_offer_algorithms(int count);
}  // namespace zo::simt

namespace {

using Bits = std::uint32_t;  // one element's storage (16-bit types in the low half)

void lt_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string(what) + ": " + cublasLtGetStatusName(s));
  }
}

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + " failed");
}

std::size_t elem_size(cudaDataType_t t) {
  return t == CUDA_R_32F ? 4 : 2;
}

double unit_roundoff(cudaDataType_t t) {
  return t == CUDA_R_32F ? 0x1p-24 : t == CUDA_R_16F ? 0x1p-11 : 0x1p-8;
}

// Half the smallest subnormal: the absolute error rounding may add near zero.
double half_min_subnormal(cudaDataType_t t) {
  return t == CUDA_R_32F ? 0x1p-150 : t == CUDA_R_16F ? 0x1p-25 : 0x1p-134;
}

const char* type_name(cudaDataType_t t) {
  return t == CUDA_R_32F ? "fp32" : t == CUDA_R_16F ? "fp16" : "bf16";
}

// Decoding written here from the formats' definitions, independent of the project's conversions.
double decode(cudaDataType_t t, Bits b) {
  if (t == CUDA_R_32F) return std::bit_cast<float>(b);
  if (t == CUDA_R_16BF) return std::bit_cast<float>(b << 16);
  const double sign = (b & 0x8000) != 0 ? -1.0 : 1.0;
  const int exponent = static_cast<int>((b >> 10) & 0x1f);
  const int mantissa = static_cast<int>(b & 0x3ff);
  if (exponent == 31) {
    return mantissa != 0 ? std::numeric_limits<double>::quiet_NaN()
                         : sign * std::numeric_limits<double>::infinity();
  }
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// Only for values the type holds exactly (normal or zero), which the tests choose.
Bits encode_exact(cudaDataType_t t, float x) {
  const Bits b = std::bit_cast<Bits>(x);
  if (t == CUDA_R_32F) return b;
  if (t == CUDA_R_16BF) return b >> 16;
  const Bits sign = (b >> 16) & 0x8000;
  if (x == 0.0f) return sign;
  const Bits exponent = ((b >> 23) & 0xff) - 127 + 15;
  return sign | exponent << 10 | ((b >> 13) & 0x3ff);
}

Bits nan_bits(cudaDataType_t t) {
  return t == CUDA_R_32F ? 0x7fc00000u : t == CUDA_R_16F ? 0x7e00u : 0x7fc0u;
}

// fp32: uniform in [-1, 1]; 16-bit types: random sign and mantissa, magnitude in [2^-8, 2).
Bits random_bits(cudaDataType_t t, std::mt19937& rng) {
  if (t == CUDA_R_32F) {
    return std::bit_cast<Bits>(std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng));
  }
  const Bits r = static_cast<Bits>(rng());
  const Bits sign = (r & 1) << 15, exponent_step = (r >> 1) % 9;
  if (t == CUDA_R_16F) return sign | (7 + exponent_step) << 10 | ((r >> 8) & 0x3ff);
  return sign | (119 + exponent_step) << 7 | ((r >> 8) & 0x7f);
}

// A column-major matrix as stored: ld * cols elements, the rows past `rows` being padding.
struct HostMatrix {
  cudaDataType_t type = CUDA_R_32F;
  std::uint64_t rows = 0, cols = 0;
  std::int64_t ld = 0;
  std::vector<Bits> bits;

  double at(std::uint64_t i, std::uint64_t j) const {
    return decode(type, bits[j * static_cast<std::uint64_t>(ld) + i]);
  }
};

HostMatrix filled(cudaDataType_t t, std::uint64_t rows, std::uint64_t cols, std::int64_t pad,
                  Bits value) {
  HostMatrix m{t, rows, cols, static_cast<std::int64_t>(rows) + pad, {}};
  m.bits.assign(static_cast<std::uint64_t>(m.ld) * cols, value);
  return m;
}

// Random values; padding holds NaN, so that reading it shows in the results.
HostMatrix random_matrix(cudaDataType_t t, std::uint64_t rows, std::uint64_t cols, std::int64_t pad,
                         std::mt19937& rng) {
  HostMatrix m = filled(t, rows, cols, pad, nan_bits(t));
  for (std::uint64_t j = 0; j < cols; ++j) {
    for (std::uint64_t i = 0; i < rows; ++i) {
      m.bits[j * static_cast<std::uint64_t>(m.ld) + i] = random_bits(t, rng);
    }
  }
  return m;
}

// Emulated device memory from cudaMalloc, filled and read back with cudaMemcpy.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    cuda_check(cudaMalloc(&ptr_, bytes), "cudaMalloc");
  }
  explicit DeviceBuffer(const HostMatrix& m) : DeviceBuffer(m.bits.size() * elem_size(m.type)) {
    upload(m);
  }
  ~DeviceBuffer() { (void)cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  void upload(const HostMatrix& m) {
    std::vector<unsigned char> bytes(bytes_);
    for (std::size_t i = 0; i < m.bits.size(); ++i)
      store_elem(bytes.data(), m.type, i, m.bits[i]);
    cuda_check(cudaMemcpy(ptr_, bytes.data(), bytes_, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  void download(HostMatrix& m) const {
    std::vector<unsigned char> bytes(bytes_);
    cuda_check(cudaMemcpy(bytes.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (std::size_t i = 0; i < m.bits.size(); ++i)
      m.bits[i] = load_elem(bytes.data(), m.type, i);
  }

 private:
  static void store_elem(unsigned char* base, cudaDataType_t t, std::size_t i, Bits b) {
    if (t == CUDA_R_32F) {
      std::memcpy(base + 4 * i, &b, 4);
    } else {
      const auto h = static_cast<std::uint16_t>(b);
      std::memcpy(base + 2 * i, &h, 2);
    }
  }
  static Bits load_elem(const unsigned char* base, cudaDataType_t t, std::size_t i) {
    if (t == CUDA_R_32F) {
      Bits b = 0;
      std::memcpy(&b, base + 4 * i, 4);
      return b;
    }
    std::uint16_t h = 0;
    std::memcpy(&h, base + 2 * i, 2);
    return h;
  }

  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

struct HandleDeleter {
  void operator()(cublasLtContext* h) const { (void)cublasLtDestroy(h); }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayout_t l) const { (void)cublasLtMatrixLayoutDestroy(l); }
};
struct DescDeleter {
  void operator()(cublasLtMatmulDesc_t d) const { (void)cublasLtMatmulDescDestroy(d); }
};
struct PrefDeleter {
  void operator()(cublasLtMatmulPreference_t p) const { (void)cublasLtMatmulPreferenceDestroy(p); }
};
using Handle = std::unique_ptr<cublasLtContext, HandleDeleter>;
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter>;
using Desc = std::unique_ptr<cublasLtMatmulDescOpaque_t, DescDeleter>;
using Pref = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PrefDeleter>;

Handle make_handle() {
  cublasLtHandle_t h = nullptr;
  lt_check(cublasLtCreate(&h), "cublasLtCreate");
  return Handle(h);
}

Layout make_layout(cudaDataType_t t, std::uint64_t rows, std::uint64_t cols, std::int64_t ld) {
  cublasLtMatrixLayout_t l = nullptr;
  lt_check(cublasLtMatrixLayoutCreate(&l, t, rows, cols, ld), "cublasLtMatrixLayoutCreate");
  return Layout(l);
}

Layout make_layout(const HostMatrix& m) {
  return make_layout(m.type, m.rows, m.cols, m.ld);
}

template <typename V>
cublasStatus_t set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, V value) {
  return cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof value);
}

template <typename V>
cublasStatus_t set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr,
                        V value) {
  return cublasLtMatmulPreferenceSetAttribute(p, attr, &value, sizeof value);
}

Desc make_desc(cublasOperation_t ta, cublasOperation_t tb, const void* bias = nullptr,
               cudaDataType_t bias_type = CUDA_R_32F) {
  cublasLtMatmulDesc_t d = nullptr;
  lt_check(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F), "DescCreate");
  Desc desc(d);
  lt_check(set_attr(d, CUBLASLT_MATMUL_DESC_TRANSA, ta), "TRANSA");
  lt_check(set_attr(d, CUBLASLT_MATMUL_DESC_TRANSB, tb), "TRANSB");
  if (bias != nullptr) {
    lt_check(set_attr(d, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS), "EPILOGUE");
    lt_check(set_attr(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(bias_type)),
             "BIAS_DATA_TYPE");
    lt_check(set_attr(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias), "BIAS_POINTER");
  }
  return desc;
}

constexpr std::size_t kWorkspaceBytes = std::size_t{4} << 20;

// Preferences as gpu/src/matmul.cpp sets them: a workspace and every operand's alignment.
Pref make_pref(std::uint32_t alignment = 256) {
  cublasLtMatmulPreference_t p = nullptr;
  lt_check(cublasLtMatmulPreferenceCreate(&p), "PreferenceCreate");
  Pref pref(p);
  lt_check(set_pref(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, std::uint64_t{kWorkspaceBytes}),
           "MAX_WORKSPACE_BYTES");
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    lt_check(set_pref(p, attr, alignment), "MIN_ALIGNMENT");
  }
  return pref;
}

cublasStatus_t heuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                         cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                         cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref,
                         cublasLtMatmulAlgo_t& algo, int* count = nullptr) {
  cublasLtMatmulHeuristicResult_t result{};
  int returned = -1;
  const cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(h, desc, a, b, c, d, pref, 1, &result, &returned);
  if (count != nullptr) *count = returned;
  if (s == CUBLAS_STATUS_SUCCESS && returned > 0) algo = result.algo;
  return s;
}

// One GEMM: op(A) m x k, op(B) k x n, C and D m x n, every ld `pad` rows past the matrix.
struct Case {
  cudaDataType_t type = CUDA_R_32F;
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  std::uint64_t m = 1, n = 1, k = 1;
  std::int64_t pad = 0;
  float alpha = 1.0f, beta = 0.0f;
  bool bias = false;
  bool in_place = false;  // C == D
  bool nan_c = false;     // C all NaN (for beta == 0)
  std::uint32_t seed = 1;
};

struct Inputs {
  HostMatrix a, b, c, bias;
};

Inputs make_inputs(const Case& cs) {
  std::mt19937 rng(cs.seed);
  Inputs in;
  const bool ta = cs.ta == CUBLAS_OP_T, tb = cs.tb == CUBLAS_OP_T;
  in.a = random_matrix(cs.type, ta ? cs.k : cs.m, ta ? cs.m : cs.k, cs.pad, rng);
  in.b = random_matrix(cs.type, tb ? cs.n : cs.k, tb ? cs.k : cs.n, cs.pad, rng);
  in.c = cs.nan_c ? filled(cs.type, cs.m, cs.n, cs.pad, nan_bits(cs.type))
                  : random_matrix(cs.type, cs.m, cs.n, cs.pad, rng);
  in.bias = random_matrix(cs.type, cs.m, 1, 0, rng);
  return in;
}

double op_at(const HostMatrix& x, bool trans, std::uint64_t i, std::uint64_t j) {
  return trans ? x.at(j, i) : x.at(i, j);
}

// Runs the case through the API on the legacy default stream; returns D as stored.
HostMatrix run_case(const Case& cs, const Inputs& in) {
  Handle h = make_handle();
  DeviceBuffer a(in.a), b(in.b), c(in.c), bias(in.bias);
  HostMatrix d = filled(cs.type, cs.m, cs.n, cs.pad, nan_bits(cs.type));
  DeviceBuffer d_out(d);
  DeviceBuffer& d_buf = cs.in_place ? c : d_out;
  Desc desc = make_desc(cs.ta, cs.tb, cs.bias ? bias.get() : nullptr, cs.type);
  Layout la = make_layout(in.a), lb = make_layout(in.b), lc = make_layout(in.c),
         ld = make_layout(d);
  Pref pref = make_pref();
  DeviceBuffer workspace(kWorkspaceBytes);
  cublasLtMatmulAlgo_t algo{};
  lt_check(heuristic(h.get(), desc.get(), la.get(), lb.get(), lc.get(), ld.get(), pref.get(), algo),
           "heuristic");
  lt_check(cublasLtMatmul(h.get(), desc.get(), &cs.alpha, a.get(), la.get(), b.get(), lb.get(),
                          &cs.beta, c.get(), lc.get(), d_buf.get(), ld.get(), &algo,
                          workspace.get(), kWorkspaceBytes, nullptr),
           "cublasLtMatmul");
  d_buf.download(d);
  return d;
}

std::string describe(const Case& cs) {
  return std::string(type_name(cs.type)) + (cs.ta == CUBLAS_OP_T ? " T" : " N") +
         (cs.tb == CUBLAS_OP_T ? "T" : "N") + " m=" + std::to_string(cs.m) +
         " n=" + std::to_string(cs.n) + " k=" + std::to_string(cs.k) +
         " pad=" + std::to_string(cs.pad) + " alpha=" + std::to_string(cs.alpha) +
         " beta=" + std::to_string(cs.beta) + (cs.bias ? " bias" : "") +
         (cs.in_place ? " in-place" : "");
}

// Each element within the fp32 dot-product bound ((k + 3) roundings of the absolute terms) plus
// one rounding to D's type, and the whole within a relative norm error of D's epsilon (1e-5 for
// fp32). Padding rows of D keep what was there.
void expect_matches_reference(const Case& cs, const Inputs& in, const HostMatrix& d) {
  const bool ta = cs.ta == CUBLAS_OP_T, tb = cs.tb == CUBLAS_OP_T;
  const double u = unit_roundoff(cs.type);
  double err2 = 0.0, ref2 = 0.0;
  int bad = 0;
  for (std::uint64_t j = 0; j < cs.n; ++j) {
    for (std::uint64_t i = 0; i < cs.m; ++i) {
      double dot = 0.0, abs_dot = 0.0;
      for (std::uint64_t p = 0; p < cs.k; ++p) {
        const double t = op_at(in.a, ta, i, p) * op_at(in.b, tb, p, j);
        dot += t;
        abs_dot += std::fabs(t);
      }
      double ref = cs.alpha * dot;
      double size = std::fabs(cs.alpha) * abs_dot;
      if (cs.beta != 0.0f) {
        ref += cs.beta * in.c.at(i, j);
        size += std::fabs(cs.beta * in.c.at(i, j));
      }
      if (cs.bias) {
        ref += in.bias.at(i, 0);
        size += std::fabs(in.bias.at(i, 0));
      }
      const double got = d.at(i, j);
      const double tol = u * std::fabs(ref) + 2.0 * static_cast<double>(cs.k + 3) * 0x1p-24 * size +
                         half_min_subnormal(cs.type);
      if (!(std::fabs(got - ref) <= tol) && ++bad <= 5) {
        ADD_FAILURE() << describe(cs) << ": D(" << i << ',' << j << ") = " << got << ", reference "
                      << ref << ", tolerance " << tol;
      }
      err2 += (got - ref) * (got - ref);
      ref2 += ref * ref;
    }
    for (std::int64_t i = static_cast<std::int64_t>(cs.m); i < d.ld; ++i) {
      const std::uint64_t at = j * static_cast<std::uint64_t>(d.ld) + static_cast<std::uint64_t>(i);
      if (d.bits[at] != nan_bits(cs.type) && ++bad <= 5) {
        ADD_FAILURE() << describe(cs) << ": padding row " << i << " of column " << j
                      << " was written";
      }
    }
  }
  EXPECT_EQ(bad, 0) << describe(cs);
  const double norm_tol = cs.type == CUDA_R_32F ? 1e-5 : u;
  EXPECT_LE(std::sqrt(err2), norm_tol * std::sqrt(ref2)) << describe(cs);
}

void check_case(const Case& cs) {
  const Inputs in = make_inputs(cs);
  expect_matches_reference(cs, in, run_case(cs, in));
}

// ---- GEMMs against the reference ----------------------------------------------------------------

struct Shape {
  std::uint64_t m, n, k;
  std::int64_t pad;
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << s.m << 'x' << s.n << 'x' << s.k << " pad " << s.pad;
}

using GemmParam = std::tuple<cudaDataType_t, cublasOperation_t, cublasOperation_t, Shape>;

class GemmTest : public ::testing::TestWithParam<GemmParam> {
 protected:
  Case base() const {
    const auto& [type, ta, tb, shape] = GetParam();
    Case cs;
    cs.type = type;
    cs.ta = ta;
    cs.tb = tb;
    cs.m = shape.m;
    cs.n = shape.n;
    cs.k = shape.k;
    cs.pad = shape.pad;
    return cs;
  }
};

TEST_P(GemmTest, AlphaBetaOutOfPlace) {
  Case cs = base();
  cs.alpha = 1.5f;
  cs.beta = -0.75f;
  check_case(cs);
}

TEST_P(GemmTest, BetaZeroLeavesNaNInCUnread) {
  Case cs = base();
  cs.alpha = -2.0f;
  cs.beta = 0.0f;
  cs.nan_c = true;
  check_case(cs);
}

TEST_P(GemmTest, InPlaceAccumulation) {  // as matmul.cpp's backward: C == D, beta = 1
  Case cs = base();
  cs.beta = 1.0f;
  cs.in_place = true;
  check_case(cs);
}

TEST_P(GemmTest, BiasEpilogue) {
  Case cs = base();
  cs.bias = true;
  check_case(cs);  // beta = 0, as matmul.cpp's forward
  cs.beta = 0.5f;
  cs.alpha = 0.25f;
  cs.in_place = true;
  check_case(cs);
}

std::string gemm_param_name(const ::testing::TestParamInfo<GemmParam>& param_info) {
  const auto& [type, ta, tb, shape] = param_info.param;
  return std::string(type_name(type)) + "_" + (ta == CUBLAS_OP_T ? "T" : "N") +
         (tb == CUBLAS_OP_T ? "T" : "N") + "_" + std::to_string(shape.m) + "x" +
         std::to_string(shape.n) + "x" + std::to_string(shape.k) + "_pad" +
         std::to_string(shape.pad);
}

INSTANTIATE_TEST_SUITE_P(
    AllTypesAndTransposes, GemmTest,
    ::testing::Combine(::testing::Values(CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF),
                       ::testing::Values(CUBLAS_OP_N, CUBLAS_OP_T),
                       ::testing::Values(CUBLAS_OP_N, CUBLAS_OP_T),
                       ::testing::Values(Shape{37, 29, 53, 0}, Shape{37, 29, 53, 3},
                                         Shape{1, 1, 1, 0}, Shape{1, 1, 1, 2}, Shape{9, 1, 17, 1})),
    gemm_param_name);

// ---- rounding and determinism -------------------------------------------------------------------

// D = alpha * 1 * 1 lands exactly halfway between two values of D's type: ties go to even.
TEST(CublasLtFake, RoundsToNearestEven) {
  struct Tie {
    cudaDataType_t type;
    float alpha, expected;
  };
  for (const Tie& t :
       {Tie{CUDA_R_16BF, 1.0f + 0x1p-8f, 1.0f},
        Tie{CUDA_R_16BF, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-6f},
        Tie{CUDA_R_16BF, -(1.0f + 0x1p-8f), -1.0f}, Tie{CUDA_R_16F, 1.0f + 0x1p-11f, 1.0f},
        Tie{CUDA_R_16F, 1.0f + 3 * 0x1p-11f, 1.0f + 0x1p-9f}}) {
    Case cs;
    cs.type = t.type;
    cs.alpha = t.alpha;
    Inputs in = make_inputs(cs);
    in.a.bits[0] = encode_exact(t.type, 1.0f);
    in.b.bits[0] = encode_exact(t.type, 1.0f);
    const HostMatrix d = run_case(cs, in);
    EXPECT_EQ(d.bits[0], encode_exact(t.type, t.expected))
        << type_name(t.type) << " alpha " << t.alpha << " gave " << d.at(0, 0);
  }
}

TEST(CublasLtFake, ResultsDoNotDependOnThreadCount) {
  for (cudaDataType_t type : {CUDA_R_32F, CUDA_R_16BF}) {
    Case cs;
    cs.type = type;
    cs.ta = CUBLAS_OP_T;
    cs.m = 131;
    cs.n = 67;
    cs.k = 257;
    cs.beta = 1.0f;
    cs.bias = true;
    const Inputs in = make_inputs(cs);
    HostMatrix one_thread;
    {
      tbb::global_control single(tbb::global_control::max_allowed_parallelism, 1);
      one_thread = run_case(cs, in);
    }
    const HostMatrix many = run_case(cs, in);
    EXPECT_EQ(one_thread.bits, many.bits) << type_name(type);
    expect_matches_reference(cs, in, many);
  }
}

// Alpha, beta, the descriptor's bias pointer and the layouts are read when cublasLtMatmul is
// called; changing or destroying them before the stream runs the GEMM changes nothing.
TEST(CublasLtFake, CapturesArgumentsAtCallTime) {
  Case cs;
  cs.m = 5;
  cs.n = 4;
  cs.k = 3;
  cs.alpha = 2.0f;
  cs.bias = true;
  const Inputs in = make_inputs(cs);
  HostMatrix other_bias = in.bias;
  for (Bits& b : other_bias.bits) {
    b = std::bit_cast<Bits>(1000.0f);
  }

  Handle h = make_handle();
  DeviceBuffer a(in.a), b(in.b), c(in.c), bias(in.bias), bias2(other_bias);
  HostMatrix d = filled(cs.type, cs.m, cs.n, 0, nan_bits(cs.type));
  DeviceBuffer d_buf(d);
  Desc desc = make_desc(cs.ta, cs.tb, bias.get(), cs.type);
  Layout la = make_layout(in.a), lb = make_layout(in.b), lc = make_layout(in.c),
         ld = make_layout(d);
  Pref pref = make_pref();
  cublasLtMatmulAlgo_t algo{};
  ASSERT_EQ(
      heuristic(h.get(), desc.get(), la.get(), lb.get(), lc.get(), ld.get(), pref.get(), algo),
      CUBLAS_STATUS_SUCCESS);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  DeviceBuffer workspace(kWorkspaceBytes);
  float alpha = cs.alpha, beta = cs.beta;
  ASSERT_EQ(cublasLtMatmul(h.get(), desc.get(), &alpha, a.get(), la.get(), b.get(), lb.get(), &beta,
                           c.get(), lc.get(), d_buf.get(), ld.get(), &algo, workspace.get(),
                           kWorkspaceBytes, stream),
            CUBLAS_STATUS_SUCCESS);
  alpha = 100.0f;
  beta = 1.0f;
  EXPECT_EQ(set_attr(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias2.get()),
            CUBLAS_STATUS_SUCCESS);
  la.reset();
  ld.reset();
  desc.reset();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  d_buf.download(d);
  expect_matches_reference(cs, in, d);
}

// ---- heuristic ----------------------------------------------------------------------------------

// One valid fp32 problem, A 4 x 5, B 5 x 3, C = D 4 x 3, its algorithm chosen for 16-byte
// alignment; each test breaks one thing. A has room for an offset, C for ld = 6.
class Refusals : public ::testing::Test {
 protected:
  void SetUp() override {
    h = make_handle();
    desc = make_desc(CUBLAS_OP_N, CUBLAS_OP_N);
    la = make_layout(CUDA_R_32F, 4, 5, 4);
    lb = make_layout(CUDA_R_32F, 5, 3, 5);
    lc = make_layout(CUDA_R_32F, 4, 3, 4);
    pref = make_pref(16);
    ASSERT_EQ(
        heuristic(h.get(), desc.get(), la.get(), lb.get(), lc.get(), lc.get(), pref.get(), algo),
        CUBLAS_STATUS_SUCCESS);
  }
  cublasStatus_t matmul(cublasLtMatmulDesc_t d, const void* a_ptr, cublasLtMatrixLayout_t a_layout,
                        void* d_ptr, cublasLtMatrixLayout_t d_layout,
                        const cublasLtMatmulAlgo_t* chosen, const float* alpha_ptr) {
    const float beta = 1.0f;
    return cublasLtMatmul(h.get(), d, alpha_ptr, a_ptr, a_layout, b.get(), lb.get(), &beta, c.get(),
                          lc.get(), d_ptr, d_layout, chosen, workspace.get(), kWorkspaceBytes,
                          nullptr);
  }
  cublasStatus_t matmul() {
    return matmul(desc.get(), a.get(), la.get(), c.get(), lc.get(), &algo, &one);
  }

  float one = 1.0f;
  Handle h;
  Desc desc;
  Layout la, lb, lc;
  Pref pref;
  cublasLtMatmulAlgo_t algo{};
  DeviceBuffer a{4 * 5 * 4 + 64}, b{5 * 3 * 4}, c{6 * 3 * 4}, bias{4 * 4};
  DeviceBuffer workspace{kWorkspaceBytes};
};

TEST_F(Refusals, HeuristicFindsOneAlgorithmWithoutWorkspace) {
  cublasLtMatmulHeuristicResult_t results[4] = {};
  int returned = 0;
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(h.get(), desc.get(), la.get(), lb.get(), lc.get(),
                                           lc.get(), pref.get(), 4, results, &returned),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(returned, 1);
  EXPECT_EQ(results[0].state, CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(results[0].workspaceSize, 0u);
  EXPECT_EQ(matmul(), CUBLAS_STATUS_SUCCESS);
}

TEST_F(Refusals, HeuristicRefusesInconsistentProblems) {
  cublasLtMatmulAlgo_t unused{};
  Layout wrong_k = make_layout(CUDA_R_32F, 6, 3, 6);  // op(B) 6 x 3 against op(A)'s k = 5
  EXPECT_EQ(heuristic(h.get(), desc.get(), la.get(), wrong_k.get(), lc.get(), lc.get(), pref.get(),
                      unused),
            CUBLAS_STATUS_INVALID_VALUE);
  Layout wrong_d = make_layout(CUDA_R_32F, 4, 2, 4);
  EXPECT_EQ(heuristic(h.get(), desc.get(), la.get(), lb.get(), lc.get(), wrong_d.get(), pref.get(),
                      unused),
            CUBLAS_STATUS_INVALID_VALUE);
  Layout half_b = make_layout(CUDA_R_16F, 5, 3, 5);  // A and B of different types
  EXPECT_EQ(heuristic(h.get(), desc.get(), la.get(), half_b.get(), lc.get(), lc.get(), pref.get(),
                      unused),
            CUBLAS_STATUS_INVALID_VALUE);
  Layout half_a = make_layout(CUDA_R_16F, 4, 5,
                              4);  // fp16 A and B into fp32: cuBLASLt has it, not the emulator
  EXPECT_EQ(heuristic(h.get(), desc.get(), half_a.get(), half_b.get(), lc.get(), lc.get(),
                      pref.get(), unused),
            CUBLAS_STATUS_NOT_SUPPORTED);
  cublasLtMatmulHeuristicResult_t result{};
  int returned = -1;
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(h.get(), desc.get(), la.get(), lb.get(), lc.get(),
                                           lc.get(), pref.get(), 0, &result, &returned),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(nullptr, desc.get(), la.get(), lb.get(), lc.get(),
                                           lc.get(), pref.get(), 1, &result, &returned),
            CUBLAS_STATUS_NOT_INITIALIZED);
}

TEST_F(Refusals, RefusedBiasEpilogueHookFindsNoAlgorithm) {
  Desc with_bias = make_desc(CUBLAS_OP_N, CUBLAS_OP_N, bias.get(), CUDA_R_32F);
  cublasLtMatmulAlgo_t unused{};
  int count = -1;
  zo::simt::cublaslt_refuse_bias_epilogue(true);
  const cublasStatus_t refused = heuristic(h.get(), with_bias.get(), la.get(), lb.get(), lc.get(),
                                           lc.get(), pref.get(), unused, &count);
  const cublasStatus_t plain =
      heuristic(h.get(), desc.get(), la.get(), lb.get(), lc.get(), lc.get(), pref.get(), unused);
  zo::simt::cublaslt_refuse_bias_epilogue(false);
  EXPECT_EQ(refused, CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(count, 0);
  EXPECT_EQ(plain, CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(heuristic(h.get(), with_bias.get(), la.get(), lb.get(), lc.get(), lc.get(), pref.get(),
                      unused),
            CUBLAS_STATUS_SUCCESS);
}

// ---- refused calls ------------------------------------------------------------------------------

TEST_F(Refusals, Layouts) {
  cublasLtMatrixLayout_t l = nullptr;
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 4, 3, 3), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 4, 3, -1), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&l, CUDA_R_64F, 4, 3, 4), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, std::uint64_t{1} << 31, 1, INT64_MAX),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasLtMatrixLayoutCreate(nullptr, CUDA_R_32F, 4, 3, 4), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(l, nullptr);
  EXPECT_EQ(cublasLtMatrixLayoutDestroy(nullptr), CUBLAS_STATUS_SUCCESS);
}

TEST_F(Refusals, Descriptors) {
  cublasLtMatmulDesc_t d = nullptr;
  EXPECT_EQ(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_16F, CUDA_R_16F),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(d, nullptr);
  cublasLtMatmulDesc_t x = desc.get();
  EXPECT_EQ(set_attr(x, CUBLASLT_MATMUL_DESC_TRANSA, std::int64_t{CUBLAS_OP_T}),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(set_attr(x, CUBLASLT_MATMUL_DESC_EPILOGUE, std::uint64_t{CUBLASLT_EPILOGUE_BIAS}),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(set_attr(x, CUBLASLT_MATMUL_DESC_BIAS_POINTER, std::uint32_t{0}),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(x, CUBLASLT_MATMUL_DESC_TRANSA, nullptr, 4),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(set_attr(x, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_RELU),
            CUBLAS_STATUS_NOT_SUPPORTED);
  for (cublasLtEpilogue_t e :
       {CUBLASLT_EPILOGUE_DRELU_BGRAD, CUBLASLT_EPILOGUE_DGELU_BGRAD, CUBLASLT_EPILOGUE_BGRADA}) {
    EXPECT_EQ(set_attr(x, CUBLASLT_MATMUL_DESC_EPILOGUE, e), CUBLAS_STATUS_NOT_SUPPORTED) << e;
  }
  EXPECT_EQ(set_attr(x, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, std::int32_t{8}),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(set_attr(x, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, std::int32_t{CUDA_R_8I}),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(set_attr(x, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_C), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(set_attr(x, CUBLASLT_MATMUL_DESC_POINTER_MODE, std::int32_t{0}),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(set_attr(x, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, std::int32_t{CUDA_R_8I}),
            CUBLAS_STATUS_NOT_SUPPORTED);
  // A refused attribute leaves the descriptor as it was.
  EXPECT_EQ(matmul(), CUBLAS_STATUS_SUCCESS);
}

TEST_F(Refusals, Preferences) {
  EXPECT_EQ(set_pref(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, std::uint32_t{0}),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(set_pref(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, std::uint64_t{16}),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(set_pref(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT, 1.0f),
            CUBLAS_STATUS_NOT_SUPPORTED);
}

// Statuses as cuBLASLt 13 answers them on an H100.
TEST_F(Refusals, MatmulInconsistentOrIncomplete) {
  Layout wrong_a = make_layout(CUDA_R_32F, 4, 6, 4);
  EXPECT_EQ(matmul(desc.get(), a.get(), wrong_a.get(), c.get(), lc.get(), &algo, &one),
            CUBLAS_STATUS_INVALID_VALUE);
  Layout half_a = make_layout(CUDA_R_16F, 4, 5, 4);
  EXPECT_EQ(matmul(desc.get(), a.get(), half_a.get(), c.get(), lc.get(), &algo, &one),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(matmul(desc.get(), nullptr, la.get(), c.get(), lc.get(), &algo, &one),
            CUBLAS_STATUS_INVALID_VALUE);
  // In place (C == D) needs C's layout to be D's; equal contents in another object will do.
  Layout padded_d = make_layout(CUDA_R_32F, 4, 3, 6);
  EXPECT_EQ(matmul(desc.get(), a.get(), la.get(), c.get(), padded_d.get(), &algo, &one),
            CUBLAS_STATUS_INVALID_VALUE);
  Layout same_as_c = make_layout(CUDA_R_32F, 4, 3, 4);
  EXPECT_EQ(matmul(desc.get(), a.get(), la.get(), c.get(), same_as_c.get(), &algo, &one),
            CUBLAS_STATUS_SUCCESS);
  // The BIAS epilogue needs a bias vector.
  Desc no_bias = make_desc(CUBLAS_OP_N, CUBLAS_OP_N);
  ASSERT_EQ(set_attr(no_bias.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(matmul(no_bias.get(), a.get(), la.get(), c.get(), lc.get(), nullptr, &one),
            CUBLAS_STATUS_INVALID_VALUE);
  // An algorithm the heuristic did not give.
  cublasLtMatmulAlgo_t zeroed{};
  EXPECT_EQ(matmul(desc.get(), a.get(), la.get(), c.get(), lc.get(), &zeroed, &one),
            CUBLAS_STATUS_NOT_SUPPORTED);
  // With beta = 0, C may be null; a null Cdesc stands for Ddesc.
  const float zero = 0.0f;
  EXPECT_EQ(cublasLtMatmul(h.get(), desc.get(), &one, a.get(), la.get(), b.get(), lb.get(), &zero,
                           nullptr, lc.get(), c.get(), lc.get(), &algo, workspace.get(),
                           kWorkspaceBytes, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(
      cublasLtMatmul(h.get(), desc.get(), &one, a.get(), la.get(), b.get(), lb.get(), &one, c.get(),
                     nullptr, c.get(), lc.get(), &algo, workspace.get(), kWorkspaceBytes, nullptr),
      CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmul(nullptr, desc.get(), &one, a.get(), la.get(), b.get(), lb.get(), &zero,
                           c.get(), lc.get(), c.get(), lc.get(), &algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_NOT_INITIALIZED);
}

// What would fault on a GPU, or what cuBLASLt refuses only for some algorithms, is refused at once
// and writes nothing.
TEST_F(Refusals, MatmulEmulatorChecks) {
  HostMatrix d = filled(CUDA_R_32F, 4, 3, 0, std::bit_cast<Bits>(7.0f));
  c.upload(d);
  std::vector<float> host_a(4 * 5, 1.0f);
  EXPECT_EQ(matmul(desc.get(), host_a.data(), la.get(), c.get(), lc.get(), &algo, &one),
            CUBLAS_STATUS_INVALID_VALUE);  // host memory as an operand
  DeviceBuffer device_alpha(sizeof(float));
  EXPECT_EQ(matmul(desc.get(), a.get(), la.get(), c.get(), lc.get(), &algo,
                   static_cast<const float*>(device_alpha.get())),
            CUBLAS_STATUS_INVALID_VALUE);  // pointer mode host: alpha must be host memory
  EXPECT_EQ(matmul(desc.get(), a.get(), la.get(), c.get(), lc.get(), &algo, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  // Less aligned than the algorithm was chosen for (cuBLASLt refuses it, with the same status,
  // where the algorithm it picked needs the alignment): A at 4 bytes for 16.
  const auto* a_off = static_cast<const unsigned char*>(a.get()) + 4;
  EXPECT_EQ(matmul(desc.get(), a_off, la.get(), c.get(), lc.get(), &algo, &one),
            CUBLAS_STATUS_INVALID_VALUE);
  // The bias was 256-byte aligned when the heuristic chose the algorithm.
  Desc with_bias = make_desc(CUBLAS_OP_N, CUBLAS_OP_N, bias.get(), CUDA_R_32F);
  cublasLtMatmulAlgo_t bias_algo{};
  ASSERT_EQ(heuristic(h.get(), with_bias.get(), la.get(), lb.get(), lc.get(), lc.get(), pref.get(),
                      bias_algo),
            CUBLAS_STATUS_SUCCESS);
  const auto* bias_off = static_cast<const unsigned char*>(bias.get()) + 4;
  ASSERT_EQ(set_attr(with_bias.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_off),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(matmul(with_bias.get(), a.get(), la.get(), c.get(), lc.get(), &bias_algo, &one),
            CUBLAS_STATUS_INVALID_VALUE);
  HostMatrix after = d;
  c.download(after);
  EXPECT_EQ(after.bits, d.bits);
  // Without an algorithm, any alignment will do.
  EXPECT_EQ(matmul(desc.get(), a_off, la.get(), c.get(), lc.get(), nullptr, &one),
            CUBLAS_STATUS_SUCCESS);
}

// ---- epilogues against the float64 reference ----------------------------------------------------

double gelu_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
double gelu_grad_ref(double x) {
  const double s = std::sqrt(2.0 / M_PI), u = s * (x + 0.044715 * x * x * x), th = std::tanh(u);
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

// One GEMM with an epilogue, in place (C == D) when beta != 0, as gpu/src/matmul*.cpp uses them;
// alpha 1, operands with a padding row. The aux matrix (m x n) has a leading dimension of m
// rounded up to 8, plus 8.
struct EpilogueCase : Case {
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
};

struct EpilogueRun {
  Inputs in;
  HostMatrix aux, bias_out, d;  // aux as given (DGELU) or as written (GELU_AUX); BGRADB's output
};

bool has(cublasLtEpilogue_t e, cublasLtEpilogue_t part) {
  return (static_cast<unsigned>(e) & static_cast<unsigned>(part)) == static_cast<unsigned>(part);
}

EpilogueRun run_epilogue(const EpilogueCase& cs) {
  EpilogueRun r{make_inputs(cs), {}, {}, {}};
  std::mt19937 rng(11);
  const bool dgelu = cs.epilogue == CUBLASLT_EPILOGUE_DGELU;
  const auto aux_pad = static_cast<std::int64_t>((cs.m + 7) / 8 * 8 + 8 - cs.m);
  r.aux = dgelu ? random_matrix(cs.type, cs.m, cs.n, aux_pad, rng)
                : filled(cs.type, cs.m, cs.n, aux_pad, nan_bits(cs.type));
  r.bias_out = filled(cs.type, cs.n, 1, 0, nan_bits(cs.type));
  Handle h = make_handle();
  DeviceBuffer a(r.in.a), b(r.in.b), c(r.in.c), bias(r.in.bias), aux(r.aux), bias_out(r.bias_out);
  r.d = cs.beta != 0.0f ? r.in.c : filled(cs.type, cs.m, cs.n, cs.pad, nan_bits(cs.type));
  DeviceBuffer d_out(r.d);
  DeviceBuffer& d_buf = cs.beta != 0.0f ? c : d_out;
  Desc desc = make_desc(cs.ta, cs.tb);
  lt_check(set_attr(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, cs.epilogue), "EPILOGUE");
  void* bias_ptr = cs.epilogue == CUBLASLT_EPILOGUE_BGRADB ? bias_out.get() : bias.get();
  lt_check(set_attr(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_ptr), "BIAS_POINTER");
  lt_check(set_attr(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux.get()), "AUX");
  lt_check(set_attr(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, r.aux.ld), "AUX_LD");
  Layout la = make_layout(r.in.a), lb = make_layout(r.in.b), ld = make_layout(r.d);
  Pref pref = make_pref();
  cublasLtMatmulAlgo_t algo{};
  lt_check(heuristic(h.get(), desc.get(), la.get(), lb.get(), ld.get(), ld.get(), pref.get(), algo),
           "heuristic");
  DeviceBuffer workspace(kWorkspaceBytes);
  const float alpha = 1.0f;
  lt_check(cublasLtMatmul(h.get(), desc.get(), &alpha, a.get(), la.get(), b.get(), lb.get(),
                          &cs.beta, d_buf.get(), ld.get(), d_buf.get(), ld.get(), &algo,
                          workspace.get(), kWorkspaceBytes, nullptr),
           "cublasLtMatmul");
  d_buf.download(r.d);
  aux.download(r.aux);
  bias_out.download(r.bias_out);
  return r;
}

// Every output element within the GEMM's bound (as expect_matches_reference) carried through the
// epilogue's slope, one rounding to its type, and 1e-5 * (1 + |x|) for fp32 tanh / cosh.
void expect_epilogue_matches_reference(const EpilogueCase& cs, const EpilogueRun& r) {
  const bool ta = cs.ta == CUBLAS_OP_T, tb = cs.tb == CUBLAS_OP_T;
  const double u = unit_roundoff(cs.type), tiny = half_min_subnormal(cs.type);
  const cublasLtEpilogue_t e = cs.epilogue;
  const bool bias = has(e, CUBLASLT_EPILOGUE_BIAS) && e != CUBLASLT_EPILOGUE_BGRADB;
  const bool gelu = has(e, CUBLASLT_EPILOGUE_GELU), dgelu = e == CUBLASLT_EPILOGUE_DGELU;
  const bool aux_out = has(e, CUBLASLT_EPILOGUE_GELU_AUX);
  int bad = 0;
  auto check = [&](const char* what, std::uint64_t i, std::uint64_t j, double got, double want,
                   double tol) {
    if (!(std::fabs(got - want) <= tol) && ++bad <= 5) {
      ADD_FAILURE() << type_name(cs.type) << " epilogue " << e << ": " << what << "(" << i << ','
                    << j << ") = " << got << ", reference " << want << ", tolerance " << tol;
    }
  };
  for (std::uint64_t j = 0; j < cs.n; ++j) {
    for (std::uint64_t i = 0; i < cs.m; ++i) {
      double x = 0.0, size = 0.0;
      for (std::uint64_t p = 0; p < cs.k; ++p) {
        const double t = op_at(r.in.a, ta, i, p) * op_at(r.in.b, tb, p, j);
        x += t;
        size += std::fabs(t);
      }
      if (cs.beta != 0.0f) {
        x += cs.beta * r.in.c.at(i, j);
        size += std::fabs(cs.beta * r.in.c.at(i, j));
      }
      if (bias) {
        x += r.in.bias.at(i, 0);
        size += std::fabs(r.in.bias.at(i, 0));
      }
      const double tol_x = 2.0 * static_cast<double>(cs.k + 3) * 0x1p-24 * size + tiny;
      const double slack = 1e-5 * (1.0 + std::fabs(x));
      if (aux_out) check("aux", i, j, r.aux.at(i, j), x, u * std::fabs(x) + tol_x);
      double want = x, slope = 1.0;
      if (gelu) want = gelu_ref(x), slope = 1.2;  // |gelu'| < 1.13
      if (dgelu) {
        const double g = gelu_grad_ref(r.aux.at(i, j));
        want = x * g;
        slope = std::fabs(g);
      }
      check("D", i, j, r.d.at(i, j), want,
            u * std::fabs(want) + slope * tol_x + ((gelu || dgelu) ? slack : 0.0) + tiny);
    }
  }
  if (e == CUBLASLT_EPILOGUE_BGRADB) {
    for (std::uint64_t j = 0; j < cs.n; ++j) {
      double sum = 0.0, size = 0.0;
      for (std::uint64_t p = 0; p < cs.k; ++p) {
        sum += op_at(r.in.b, tb, p, j);
        size += std::fabs(op_at(r.in.b, tb, p, j));
      }
      check("bias gradient", j, 0, r.bias_out.at(j, 0), sum,
            u * std::fabs(sum) + 2.0 * static_cast<double>(cs.k + 1) * 0x1p-24 * size + tiny);
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(CublasLtFakeEpilogues, MatchTheReference) {
  for (cudaDataType_t type : {CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF}) {
    for (cublasLtEpilogue_t e :
         {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_GELU_AUX, CUBLASLT_EPILOGUE_GELU_BIAS,
          CUBLASLT_EPILOGUE_DGELU, CUBLASLT_EPILOGUE_BGRADB}) {
      EpilogueCase cs;
      cs.type = type;
      cs.epilogue = e;
      cs.m = 37, cs.n = 29, cs.k = 53, cs.pad = 1;
      // As gpu/src/matmul*.cpp: forward op_T(A) . B; DGELU A . B; BGRADB A . op_T(B), beta 1.
      cs.ta = has(e, CUBLASLT_EPILOGUE_GELU) ? CUBLAS_OP_T : CUBLAS_OP_N;
      cs.tb = e == CUBLASLT_EPILOGUE_BGRADB ? CUBLAS_OP_T : CUBLAS_OP_N;
      cs.beta = e == CUBLASLT_EPILOGUE_BGRADB ? 1.0f : 0.0f;
      SCOPED_TRACE(std::string(type_name(type)) + " epilogue " + std::to_string(e));
      expect_epilogue_matches_reference(cs, run_epilogue(cs));
    }
  }
}

// The heuristic's candidates with the test hook: as many as offered (capped by the request), and
// every one computes the same bits.
TEST(CublasLtFakeEpilogues, OfferedAlgorithmsComputeTheSameBits) {
  zo::simt::cublaslt_offer_algorithms(3);
  Handle h = make_handle();
  Case cs;
  cs.m = 9;
  cs.n = 7;
  cs.k = 5;
  const Inputs in = make_inputs(cs);
  DeviceBuffer a(in.a), b(in.b);
  HostMatrix d = filled(cs.type, cs.m, cs.n, 0, nan_bits(cs.type));
  Desc desc = make_desc(cs.ta, cs.tb);
  Layout la = make_layout(in.a), lb = make_layout(in.b), ld = make_layout(d);
  Pref pref = make_pref();
  cublasLtMatmulHeuristicResult_t results[4] = {};
  int returned = 0;
  const cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(h.get(), desc.get(), la.get(), lb.get(), ld.get(), ld.get(),
                                     pref.get(), 4, results, &returned);
  int two = 0;
  cublasLtMatmulHeuristicResult_t capped[2] = {};
  (void)cublasLtMatmulAlgoGetHeuristic(h.get(), desc.get(), la.get(), lb.get(), ld.get(), ld.get(),
                                       pref.get(), 2, capped, &two);
  zo::simt::cublaslt_offer_algorithms(1);
  ASSERT_EQ(s, CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(returned, 3);
  EXPECT_EQ(two, 2);
  std::vector<Bits> first;
  for (int i = 0; i < returned; ++i) {
    DeviceBuffer out(d);
    const float one = 1.0f, zero = 0.0f;
    ASSERT_EQ(cublasLtMatmul(h.get(), desc.get(), &one, a.get(), la.get(), b.get(), lb.get(), &zero,
                             nullptr, ld.get(), out.get(), ld.get(), &results[i].algo, nullptr, 0,
                             nullptr),
              CUBLAS_STATUS_SUCCESS);
    HostMatrix got = d;
    out.download(got);
    if (i == 0) first = got.bits;
    EXPECT_EQ(got.bits, first) << "candidate " << i;
  }
}

TEST_F(Refusals, EpilogueArgumentsAndHooks) {
  DeviceBuffer aux(8 * 3 * 4);
  auto with = [&](cublasLtEpilogue_t e, std::int64_t aux_ld) {
    Desc x = make_desc(CUBLAS_OP_N, CUBLAS_OP_N);
    lt_check(set_attr(x.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, e), "EPILOGUE");
    lt_check(set_attr(x.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias.get()), "BIAS_POINTER");
    lt_check(set_attr(x.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux.get()), "AUX");
    lt_check(set_attr(x.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld), "AUX_LD");
    return x;
  };
  cublasLtMatmulAlgo_t chosen{};
  auto heuristic_for = [&](const Desc& x) {
    return heuristic(h.get(), x.get(), la.get(), lb.get(), lc.get(), lc.get(), pref.get(), chosen);
  };
  // The aux leading dimension: a multiple of 8, at least m (4).
  EXPECT_EQ(heuristic_for(with(CUBLASLT_EPILOGUE_DGELU, 4)), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(heuristic_for(with(CUBLASLT_EPILOGUE_GELU_AUX, 0)), CUBLAS_STATUS_INVALID_VALUE);
  Desc dgelu = with(CUBLASLT_EPILOGUE_DGELU, 8);
  ASSERT_EQ(heuristic_for(dgelu), CUBLAS_STATUS_SUCCESS);
  // Arithmetic cublasLt.h leaves open is not guessed: DGELU with beta != 0 (matmul() uses 1).
  EXPECT_EQ(matmul(dgelu.get(), a.get(), la.get(), c.get(), lc.get(), &chosen, &one),
            CUBLAS_STATUS_NOT_SUPPORTED);
  Desc bgrad = with(CUBLASLT_EPILOGUE_BGRADB, 8);
  ASSERT_EQ(heuristic_for(bgrad), CUBLAS_STATUS_SUCCESS);
  const float two = 2.0f;
  EXPECT_EQ(matmul(bgrad.get(), a.get(), la.get(), c.get(), lc.get(), &chosen, &two),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(matmul(bgrad.get(), a.get(), la.get(), c.get(), lc.get(), &chosen, &one),
            CUBLAS_STATUS_SUCCESS);
  // A missing aux matrix; a bias of another type than D.
  Desc no_aux = with(CUBLASLT_EPILOGUE_GELU_AUX, 8);
  lt_check(set_attr(no_aux.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                    static_cast<void*>(nullptr)),
           "AUX");
  const float zero = 0.0f;
  EXPECT_EQ(cublasLtMatmul(h.get(), no_aux.get(), &one, a.get(), la.get(), b.get(), lb.get(), &zero,
                           nullptr, lc.get(), c.get(), lc.get(), nullptr, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  Desc half_bias = with(CUBLASLT_EPILOGUE_BGRADB, 8);
  lt_check(set_attr(half_bias.get(), CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                    static_cast<std::int32_t>(CUDA_R_16F)),
           "BIAS_DATA_TYPE");
  EXPECT_EQ(heuristic_for(half_bias), CUBLAS_STATUS_NOT_SUPPORTED);
  // The hook refuses every epilogue but DEFAULT.
  zo::simt::cublaslt_refuse_epilogues(true);
  const cublasStatus_t refused = heuristic_for(with(CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 8));
  const cublasStatus_t plain = heuristic_for(desc);
  zo::simt::cublaslt_refuse_epilogues(false);
  EXPECT_EQ(refused, CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(plain, CUBLAS_STATUS_SUCCESS);
}

TEST(CublasLtFake, StatusNamesAndStrings) {
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
  for (cublasStatus_t s :
       {CUBLAS_STATUS_SUCCESS, CUBLAS_STATUS_NOT_INITIALIZED, CUBLAS_STATUS_ALLOC_FAILED,
        CUBLAS_STATUS_INVALID_VALUE, CUBLAS_STATUS_ARCH_MISMATCH, CUBLAS_STATUS_EXECUTION_FAILED,
        CUBLAS_STATUS_INTERNAL_ERROR, CUBLAS_STATUS_NOT_SUPPORTED}) {
    EXPECT_GT(std::strlen(cublasLtGetStatusString(s)), 0u) << cublasLtGetStatusName(s);
  }
  EXPECT_EQ(cublasLtDestroy(nullptr), CUBLAS_STATUS_INVALID_VALUE);
}

}  // namespace
