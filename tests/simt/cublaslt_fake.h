// Internals of the SIMT emulator's cuBLASLt, shared by cublaslt_fake.cpp (the API: descriptors,
// the heuristic, the checks cuBLASLt makes) and cublaslt_fake_gemm.cpp (the arithmetic).
#pragma once

#include <cublasLt.h>

#include <cstdint>

namespace zo::simt::lt {

// What an implemented epilogue does, decoded from its cublasLtEpilogue_t. With x = alpha * op(A)
// op(B) + beta * C (+ bias), D = x, gelu(x) or x * gelu'(aux); GELU is the tanh form.
struct Epilogue {
  bool bias = false;     // x += bias (length m), broadcast over D's columns
  bool gelu = false;     // D = gelu(x)
  bool aux_out = false;  // the aux matrix (m x n) = x, the GELU input, rounded to its type
  bool dgelu = false;    // D = x * gelu'(aux)
  bool bgradb = false;   // bias (length n) = sums of op(B)'s columns over k
  bool uses_aux() const { return aux_out || dgelu; }
};

// False for an epilogue the emulator does not implement (ReLU, BGRADA, DGELU_BGRAD, ...).
bool decode_epilogue(std::uint32_t epilogue, Epilogue& out);

// One GEMM, captured by value when cublasLtMatmul is called.
struct Gemm {
  cudaDataType_t type;  // A, B, C and D
  bool ta, tb;
  std::uint64_t m, n, k;
  const void* a;
  const void* b;
  const void* c;
  void* d;
  std::uint64_t lda, ldb, ldc, ldd;
  float alpha, beta;
  Epilogue epilogue;
  void* bias;  // read (BIAS) or written (BGRADB); null otherwise
  cudaDataType_t bias_type;
  void* aux;  // written (GELU_AUX) or read (DGELU); null otherwise
  std::uint64_t aux_ld;
  cudaDataType_t aux_type;
};

// Runs g on the calling thread: fp32 sums over k ascending (BGRADB's exact), one rounding to each
// output's type.
void run_gemm(const Gemm& g);

}  // namespace zo::simt::lt
