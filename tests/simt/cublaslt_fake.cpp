// The cuBLASLt calls gpu/src/matmul*.cpp make, over the emulated device's memory, for the SIMT
// emulator (tests/simt/simt.h): the emulated build links this instead of libcublasLt. Only
// column-major fp32/fp16/bf16 GEMMs with equal types, fp32 compute and the epilogues DEFAULT,
// BIAS, GELU(_AUX)(_BIAS), DGELU and BGRADB are implemented; anything else is refused, and a call
// not defined here fails to link.
//
// The GEMM follows cuBLASLt's contract: D = alpha * op(A) op(B) + beta * C, C unread when
// beta == 0, in place when C == D; then the epilogue as cublasLt.h documents it (cublaslt_fake.h
// spells out each): the bias (length m) is added before the GELU, GELU_AUX writes the GELU input
// to the aux matrix (leading dimension EPILOGUE_AUX_LD: a multiple of 8, at least m), DGELU
// multiplies by gelu'(aux), BGRADB writes the column sums of op(B) over k (length n) to the bias
// pointer; bias and aux default to D's type. Where the documentation leaves the arithmetic open
// (alpha with BGRADB, beta with the GELU epilogues) the call is refused as not implemented. It
// runs on the stream (streams.h) with everything captured at call time (cublaslt_fake_gemm.cpp
// has the arithmetic). Misuse the library would reject, or that would fault on a GPU (host
// memory as an operand, a pointer less aligned than the chosen algorithm assumes), is refused at
// once, with the status cuBLASLt 13 gives on an H100 where that was checked.
#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <type_traits>

#include "cublaslt_fake.h"
#include "streams.h"

namespace zo::simt {
// Test hooks. While set, the heuristic finds no algorithm for the BIAS epilogue (as cuBLASLt may
// for some alignments), or for any epilogue, so that callers' fallback paths run.
void cublaslt_refuse_bias_epilogue(bool refuse);
void cublaslt_refuse_epilogues(bool refuse);
// The heuristic returns up to `count` algorithms (default 1), all computing the same bits, so
// that callers' choice between candidates runs.
void cublaslt_offer_algorithms(int count);
// While index >= 0, every offered algorithm but that one sleeps 2 ms per GEMM, so that timing the
// candidates picks it; -1 (the default) times them as they run.
void cublaslt_make_fastest(int index);
// For a whole process (offload_train_simt), ZO_SIMT_CUBLASLT_ALGORITHMS and
// ZO_SIMT_CUBLASLT_FASTEST set the two hooks above when the first handle is made.
}  // namespace zo::simt

// Only forward-declared by cublasLt.h: the handle is ours to define.
struct cublasLtContext {
  std::uint64_t tag = 0;
};

namespace {

std::atomic<bool> g_refuse_bias{false};
std::atomic<bool> g_refuse_epilogues{false};
std::atomic<int> g_algorithms{1};
std::atomic<int> g_fastest{-1};

// Tags mark live objects of each kind, so that a zeroed, destroyed or mixed-up one is refused.
constexpr std::uint64_t kHandleTag = 0x7a6f'4c74'4861'6e64;  // "zoLtHand"
constexpr std::uint64_t kLayoutTag = 0x7a6f'4c74'4c61'7930;
constexpr std::uint64_t kDescTag = 0x7a6f'4c74'4465'7363;
constexpr std::uint64_t kPrefTag = 0x7a6f'4c74'5072'6566;
constexpr std::uint64_t kAlgoTag = 0x7a6f'4c74'416c'676f;

constexpr std::uint32_t kMaxAlignment = 256;  // cuBLASLt's default and largest alignment

// The descriptors are semi-opaque: cublasLt.h fixes their size (callers may own the storage), so
// the state lives in their bytes, copied in and out.
struct Layout {
  std::uint64_t tag;
  cudaDataType_t type;
  std::uint64_t rows, cols;
  std::int64_t ld;
};

struct Desc {
  std::uint64_t tag;
  cublasOperation_t transa, transb;
  cublasLtEpilogue_t epilogue;
  std::int32_t bias_type;  // -1: D's type
  void* bias;
  void* aux;
  std::int64_t aux_ld;
  std::int32_t aux_type;  // -1: D's type
};

struct Pref {
  std::uint64_t tag;
  std::uint64_t max_workspace;
  std::uint32_t align[4];  // minimum alignment in bytes of A, B, C, D
};

// What the heuristic promised an algorithm for; cublasLtMatmul checks it still holds.
struct Algo {
  std::uint64_t tag;
  cudaDataType_t type;
  cublasLtEpilogue_t epilogue;
  std::uint32_t align[6];  // A, B, C, D, bias, aux
  std::int32_t index;      // which of the heuristic's candidates (they compute the same bits)
};

template <typename State, typename Opaque>
void store(Opaque* opaque, const State& state) {
  static_assert(std::is_trivially_copyable_v<State> && sizeof(State) <= sizeof(Opaque::data));
  std::memset(opaque->data, 0, sizeof opaque->data);
  std::memcpy(opaque->data, &state, sizeof state);
}

template <typename State, typename Opaque>
bool load(const Opaque* opaque, std::uint64_t tag, State& state) {
  static_assert(std::is_trivially_copyable_v<State> && sizeof(State) <= sizeof(Opaque::data));
  if (opaque == nullptr) return false;
  std::memcpy(&state, opaque->data, sizeof state);
  return state.tag == tag;
}

bool valid_handle(cublasLtHandle_t handle) {
  return handle != nullptr && handle->tag == kHandleTag;
}

bool supported_type(std::int64_t type) {
  return type == CUDA_R_32F || type == CUDA_R_16F || type == CUDA_R_16BF;
}

std::size_t type_size(cudaDataType_t type) {
  return type == CUDA_R_32F ? 4 : 2;
}

// Largest power of two dividing the address, capped at 256 (a null pointer counts as 256).
std::uint32_t alignment_of(const void* p) {
  const auto bits = reinterpret_cast<std::uintptr_t>(p) | kMaxAlignment;
  return static_cast<std::uint32_t>(bits & (~bits + 1));
}

bool aligned(const void* p, std::uint32_t alignment) {
  return alignment <= 1 || reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

std::uint64_t op_rows(const Layout& l, cublasOperation_t op) {
  return op == CUBLAS_OP_N ? l.rows : l.cols;
}
std::uint64_t op_cols(const Layout& l, cublasOperation_t op) {
  return op == CUBLAS_OP_N ? l.cols : l.rows;
}

// A null Cdesc stands for Ddesc, as in cuBLASLt.
bool load_layouts(cublasLtMatrixLayout_t a_desc, cublasLtMatrixLayout_t b_desc,
                  cublasLtMatrixLayout_t c_desc, cublasLtMatrixLayout_t d_desc, Layout& a,
                  Layout& b, Layout& c, Layout& d) {
  return load(a_desc, kLayoutTag, a) && load(b_desc, kLayoutTag, b) &&
         load(d_desc, kLayoutTag, d) && load(c_desc != nullptr ? c_desc : d_desc, kLayoutTag, c);
}

bool same_layout(const Layout& x, const Layout& y) {
  return x.type == y.type && x.rows == y.rows && x.cols == y.cols && x.ld == y.ld;
}

// The checks the heuristic and the matmul share: op(A) m x k, op(B) k x n, C and D m x n, and one
// data type throughout. A and B of different types, or C and D, are invalid (as cuBLASLt answers
// for these types); A and B of another type than C and D, which cuBLASLt has for some pairs, are
// not implemented. Bias and aux have D's type. The aux leading dimension must be a multiple of 8
// and at least m (cublasLt.h, EPILOGUE_AUX_LD).
cublasStatus_t check_problem(const Desc& d, const Layout& a, const Layout& b, const Layout& c,
                             const Layout& out) {
  if (a.type != b.type || c.type != out.type) return CUBLAS_STATUS_INVALID_VALUE;
  if (a.type != out.type) return CUBLAS_STATUS_NOT_SUPPORTED;
  const std::uint64_t m = out.rows, n = out.cols, k = op_cols(a, d.transa);
  if (op_rows(a, d.transa) != m || op_rows(b, d.transb) != k || op_cols(b, d.transb) != n ||
      c.rows != m || c.cols != n) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  zo::simt::lt::Epilogue e;
  if (!zo::simt::lt::decode_epilogue(d.epilogue, e)) return CUBLAS_STATUS_NOT_SUPPORTED;
  const auto type = static_cast<std::int32_t>(out.type);
  if ((e.bias || e.bgradb) && d.bias_type != -1 && d.bias_type != type) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (e.uses_aux()) {
    if (d.aux_type != -1 && d.aux_type != type) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (d.aux_ld < static_cast<std::int64_t>(m) || d.aux_ld % 8 != 0) {
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

// True when the whole column-major matrix lies in emulated device memory (first and last
// element: a matrix spans one allocation).
bool on_device(const void* p, const Layout& l) {
  if (l.rows == 0 || l.cols == 0) return true;
  const std::uint64_t last = (l.cols - 1) * static_cast<std::uint64_t>(l.ld) + l.rows - 1;
  const auto* bytes = static_cast<const unsigned char*>(p);
  const std::size_t es = type_size(l.type);
  return zo::simt::is_device_pointer(bytes) &&
         zo::simt::is_device_pointer(bytes + last * es + es - 1);
}

}  // namespace

namespace zo::simt {

void cublaslt_refuse_bias_epilogue(bool refuse) {
  g_refuse_bias.store(refuse);
}

void cublaslt_refuse_epilogues(bool refuse) {
  g_refuse_epilogues.store(refuse);
}

void cublaslt_offer_algorithms(int count) {
  g_algorithms.store(std::max(count, 1));
}

void cublaslt_make_fastest(int index) {
  g_fastest.store(index);
}

}  // namespace zo::simt

extern "C" {

// ---- handle and status text ---------------------------------------------------------------------

cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle) {
  if (lightHandle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  static const bool from_environment = [] {
    if (const char* n = std::getenv("ZO_SIMT_CUBLASLT_ALGORITHMS"))
      zo::simt::cublaslt_offer_algorithms(std::atoi(n));
    if (const char* i = std::getenv("ZO_SIMT_CUBLASLT_FASTEST"))
      zo::simt::cublaslt_make_fastest(std::atoi(i));
    return true;
  }();
  (void)from_environment;
  *lightHandle = new cublasLtContext{kHandleTag};
  return CUBLAS_STATUS_SUCCESS;
}

// Work already enqueued holds copies of everything it needs, not the handle.
cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
  if (lightHandle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;  // as cuBLASLt answers
  if (!valid_handle(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  lightHandle->tag = 0;
  delete lightHandle;
  return CUBLAS_STATUS_SUCCESS;
}

// A CUDA 13 cuBLASLt's version number (major * 10000 + minor * 100 + patch).
size_t cublasLtGetVersion(void) {
  return 130000;
}

const char* cublasLtGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized (no valid handle)";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an unsupported value or parameter was passed to the function";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "the device does not support the requested feature";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "access to device memory failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the requested functionality is not supported (by the SIMT emulator's cuBLASLt)";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "license error";
  }
  return "unknown cuBLAS status";
}

// ---- matrix layouts -----------------------------------------------------------------------------

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (matLayout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  // cuBLASLt documents int32 extents as the usual limit; the order stays column-major. cuBLASLt
  // creates any layout and refuses a bad one when it is used: refusing here is earlier.
  constexpr auto kMaxExtent = static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max());
  if (!supported_type(type) || rows > kMaxExtent || cols > kMaxExtent) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  // Columns must not overlap: ld >= rows.
  if (ld < static_cast<std::int64_t>(rows)) return CUBLAS_STATUS_INVALID_VALUE;
  auto* layout = new cublasLtMatrixLayoutOpaque_t;
  store(layout, Layout{kLayoutTag, type, rows, cols, ld});
  *matLayout = layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  if (matLayout == nullptr) return CUBLAS_STATUS_SUCCESS;
  std::memset(matLayout->data, 0, sizeof matLayout->data);
  delete matLayout;
  return CUBLAS_STATUS_SUCCESS;
}

// ---- matmul descriptors -------------------------------------------------------------------------

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType) {
  if (matmulDesc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  // True fp32 only: no TF32 or down-converting modes, no pedantic, fp32 alpha and beta (cuBLASLt
  // creates the others; this stand-in cannot run them).
  if (computeType != CUBLAS_COMPUTE_32F || scaleType != CUDA_R_32F) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  auto* desc = new cublasLtMatmulDescOpaque_t;
  store(desc, Desc{kDescTag, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, -1, nullptr,
                   nullptr, 0, -1});
  *matmulDesc = desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  if (matmulDesc == nullptr) return CUBLAS_STATUS_SUCCESS;
  std::memset(matmulDesc->data, 0, sizeof matmulDesc->data);
  delete matmulDesc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t sizeInBytes) {
  Desc d{};
  if (!load(matmulDesc, kDescTag, d) || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  // TRANSA, TRANSB, BIAS_DATA_TYPE, EPILOGUE_AUX_DATA_TYPE: int32_t; EPILOGUE: uint32_t;
  // EPILOGUE_AUX_LD: int64_t.
  std::int32_t i32 = 0;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
      if (sizeInBytes != sizeof i32) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&i32, buf, sizeof i32);
      // Conjugation means nothing for real types; only N and T are implemented.
      if (i32 != CUBLAS_OP_N && i32 != CUBLAS_OP_T) return CUBLAS_STATUS_NOT_SUPPORTED;
      (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d.transa : d.transb) =
          static_cast<cublasOperation_t>(i32);
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: {
      std::uint32_t e = 0;
      if (sizeInBytes != sizeof e) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&e, buf, sizeof e);
      zo::simt::lt::Epilogue unused;
      if (!zo::simt::lt::decode_epilogue(e, unused)) return CUBLAS_STATUS_NOT_SUPPORTED;
      d.epilogue = static_cast<cublasLtEpilogue_t>(e);
      break;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      if (sizeInBytes != sizeof d.bias) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&d.bias, buf, sizeof d.bias);
      break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      if (sizeInBytes != sizeof i32) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&i32, buf, sizeof i32);
      if (i32 != -1 && !supported_type(i32)) return CUBLAS_STATUS_NOT_SUPPORTED;
      d.bias_type = i32;
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      if (sizeInBytes != sizeof d.aux) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&d.aux, buf, sizeof d.aux);
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      if (sizeInBytes != sizeof d.aux_ld) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&d.aux_ld, buf, sizeof d.aux_ld);
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
      if (sizeInBytes != sizeof i32) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&i32, buf, sizeof i32);
      if (i32 != -1 && !supported_type(i32)) return CUBLAS_STATUS_NOT_SUPPORTED;
      d.aux_type = i32;
      break;
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  store(matmulDesc, d);
  return CUBLAS_STATUS_SUCCESS;
}

// ---- heuristic preferences ----------------------------------------------------------------------

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto* p = new cublasLtMatmulPreferenceOpaque_t;
  // Documented defaults: no workspace, 256-byte alignment of every operand.
  store(p, Pref{kPrefTag, 0, {kMaxAlignment, kMaxAlignment, kMaxAlignment, kMaxAlignment}});
  *pref = p;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  if (pref == nullptr) return CUBLAS_STATUS_SUCCESS;
  std::memset(pref->data, 0, sizeof pref->data);
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t sizeInBytes) {
  Pref p{};
  if (!load(pref, kPrefTag, p) || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      if (sizeInBytes != sizeof p.max_workspace) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&p.max_workspace, buf, sizeof p.max_workspace);
      break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: {
      std::uint32_t& a = p.align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES];
      if (sizeInBytes != sizeof a) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&a, buf, sizeof a);
      break;
    }
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  store(pref, p);
  return CUBLAS_STATUS_SUCCESS;
}

// ---- heuristic ----------------------------------------------------------------------------------

// One algorithm for every supported problem (g_algorithms of them with the test hook): it needs
// no workspace and assumes the operands are as aligned as the preference promises, the bias and
// aux as aligned as the descriptor's pointers.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount) {
  if (!valid_handle(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  Desc d{};
  Layout a{}, b{}, c{}, out{};
  Pref p{};
  if (!load(operationDesc, kDescTag, d) ||
      !load_layouts(Adesc, Bdesc, Cdesc, Ddesc, a, b, c, out) || !load(preference, kPrefTag, p) ||
      requestedAlgoCount <= 0 || heuristicResultsArray == nullptr || returnAlgoCount == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  *returnAlgoCount = 0;
  if (const cublasStatus_t s = check_problem(d, a, b, c, out); s != CUBLAS_STATUS_SUCCESS) return s;
  const bool refused = d.epilogue != CUBLASLT_EPILOGUE_DEFAULT && g_refuse_epilogues.load();
  if (refused || (d.epilogue == CUBLASLT_EPILOGUE_BIAS && g_refuse_bias.load())) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  Algo algo{kAlgoTag, out.type, d.epilogue, {}, 0};
  std::copy(std::begin(p.align), std::end(p.align), algo.align);
  algo.align[4] = alignment_of(d.bias);
  algo.align[5] = alignment_of(d.aux);
  const int count = std::min(requestedAlgoCount, g_algorithms.load());
  for (int i = 0; i < count; ++i) {
    algo.index = i;
    cublasLtMatmulHeuristicResult_t& r = heuristicResultsArray[i];
    r = cublasLtMatmulHeuristicResult_t{};
    store(&r.algo, algo);
    r.workspaceSize = 0;
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
  }
  *returnAlgoCount = count;
  return CUBLAS_STATUS_SUCCESS;
}

// ---- matmul -------------------------------------------------------------------------------------

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                              const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                              const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspaceSizeInBytes, cudaStream_t stream) {
  if (!valid_handle(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  Desc d{};
  Layout a{}, b{}, c{}, out{};
  if (!load(computeDesc, kDescTag, d) || !load_layouts(Adesc, Bdesc, Cdesc, Ddesc, a, b, c, out)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (const cublasStatus_t s = check_problem(d, a, b, c, out); s != CUBLAS_STATUS_SUCCESS) return s;
  // Pointer mode host: alpha and beta are read now, from host memory.
  if (alpha == nullptr || beta == nullptr || zo::simt::is_device_pointer(alpha) ||
      zo::simt::is_device_pointer(beta)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  zo::simt::lt::Gemm g{};
  std::memcpy(&g.alpha, alpha, sizeof g.alpha);
  std::memcpy(&g.beta, beta, sizeof g.beta);
  zo::simt::lt::Epilogue& e = g.epilogue;
  zo::simt::lt::decode_epilogue(d.epilogue, e);  // check_problem accepted it
  // Where cublasLt.h leaves the arithmetic open, this stand-in does not guess.
  if ((e.bgradb && g.alpha != 1.0f) || ((e.gelu || e.dgelu) && g.beta != 0.0f)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const bool with_bias = e.bias || e.bgradb;
  // C is only read when beta != 0, and only then required (cuBLASLt accepts a null C otherwise).
  if (A == nullptr || B == nullptr || D == nullptr || (g.beta != 0.0f && C == nullptr) ||
      (with_bias && d.bias == nullptr) || (e.uses_aux() && d.aux == nullptr)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  // In place needs C's layout to be D's; otherwise C and D are separate matrices.
  if (C == D && !same_layout(c, out)) return CUBLAS_STATUS_INVALID_VALUE;
  int algo_index = 0;
  if (algo != nullptr) {  // null: cuBLASLt picks one itself, suited to these pointers
    Algo chosen{};
    if (!load(algo, kAlgoTag, chosen) || chosen.type != out.type) {
      return CUBLAS_STATUS_NOT_SUPPORTED;  // as cuBLASLt answers for an algorithm it did not give
    }
    algo_index = chosen.index;
    // A pointer less aligned than the algorithm was chosen for: cuBLASLt refuses it the same way.
    const bool same_epilogue = chosen.epilogue == d.epilogue;
    const void* operands[6] = {A,
                               B,
                               C,
                               D,
                               same_epilogue && with_bias ? d.bias : nullptr,
                               same_epilogue && e.uses_aux() ? d.aux : nullptr};
    for (int i = 0; i < 6; ++i) {
      if (!aligned(operands[i], chosen.align[i])) return CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  if (workspaceSizeInBytes > 0 && workspace != nullptr && !zo::simt::is_device_pointer(workspace)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  // On a GPU, host memory as an operand faults in the kernel; here it is refused up front. The
  // bias has m elements (BIAS) or n (BGRADB); the aux matrix is m x n.
  const std::uint64_t bias_n = e.bgradb ? out.cols : out.rows;
  const Layout bias_layout{kLayoutTag, out.type, bias_n, 1, static_cast<std::int64_t>(bias_n)};
  const Layout aux_layout{kLayoutTag, out.type, out.rows, out.cols, d.aux_ld};
  if (!on_device(A, a) || !on_device(B, b) || !on_device(D, out) ||
      (g.beta != 0.0f && !on_device(C, c)) || (with_bias && !on_device(d.bias, bias_layout)) ||
      (e.uses_aux() && !on_device(d.aux, aux_layout))) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  g.type = out.type;
  g.ta = d.transa == CUBLAS_OP_T;
  g.tb = d.transb == CUBLAS_OP_T;
  g.m = out.rows;
  g.n = out.cols;
  g.k = op_cols(a, d.transa);
  g.a = A;
  g.b = B;
  g.c = C;
  g.d = D;
  g.lda = static_cast<std::uint64_t>(a.ld);
  g.ldb = static_cast<std::uint64_t>(b.ld);
  g.ldc = static_cast<std::uint64_t>(c.ld);
  g.ldd = static_cast<std::uint64_t>(out.ld);
  g.bias = with_bias ? d.bias : nullptr;
  g.bias_type = out.type;
  g.aux = e.uses_aux() ? d.aux : nullptr;
  g.aux_ld = static_cast<std::uint64_t>(d.aux_ld);
  g.aux_type = out.type;
  if (g.m == 0 || g.n == 0) return CUBLAS_STATUS_SUCCESS;
  const bool slow = g_fastest.load() >= 0 && algo_index != g_fastest.load();
  zo::simt::enqueue(
      stream,
      [g, slow] {
        if (slow) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        zo::simt::lt::run_gemm(g);
      },
      {{g.a, 1}, {g.b, 1}, {g.c, 1}, {g.d, 1}, {g.bias, 1}, {g.aux, 1}}, "a cublasLtMatmul");
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
