// cuBLASLt through a table of its entry points, filled when the first matmul context is made:
// the library is opened then (dlopen), not at every program start, where mapping and relocating
// its 540 MB cost each process about 0.15 s and 200 MB of resident memory (`offload_train --help`,
// runs on the host backend, `plan`, `tokenize`, every test process). Members carry the API's own
// names, so a failing call reads as it does in cuBLASLt's documentation:
// ZO_CUBLAS_CHECK(cublaslt().cublasLtCreate(&handle)).
#pragma once

#include <cublasLt.h>

// Every cuBLASLt function gpu/ calls.
#define ZO_CUBLASLT_ENTRIES(X)            \
  X(cublasLtCreate)                       \
  X(cublasLtDestroy)                      \
  X(cublasLtGetVersion)                   \
  X(cublasLtGetStatusName)                \
  X(cublasLtGetStatusString)              \
  X(cublasLtMatmul)                       \
  X(cublasLtMatmulAlgoGetHeuristic)       \
  X(cublasLtMatmulDescCreate)             \
  X(cublasLtMatmulDescDestroy)            \
  X(cublasLtMatmulDescSetAttribute)       \
  X(cublasLtMatmulPreferenceCreate)       \
  X(cublasLtMatmulPreferenceDestroy)      \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatrixLayoutCreate)           \
  X(cublasLtMatrixLayoutDestroy)

namespace zo::gpu {

struct CublasLt {
#define ZO_CUBLASLT_MEMBER(name) decltype(&::name) name = nullptr;
  ZO_CUBLASLT_ENTRIES(ZO_CUBLASLT_MEMBER)
#undef ZO_CUBLASLT_MEMBER
};

// The table; the first call opens the library (once, thread-safe; a failed attempt is retried by
// the next call). Throws CublasError naming the library, where it was looked for and the fix.
// The emulator's build (ZO_CUBLASLT_LINKED) fills it with its own cuBLASLt, linked in.
const CublasLt& cublaslt();

}  // namespace zo::gpu
