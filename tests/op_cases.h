// The op-case table: every op of zo::dev::Device once, as a list of cases (the op, its shapes,
// how its inputs are drawn, how each output is compared), and one runner that executes a case on
// a backend under test and on a reference backend from identical inputs and compares every
// output. Three binaries run the same table:
//
// - test_cuda_ops (a real GPU; skips without one) and test_cuda_ops_simt (the same source linked
//   against the SIMT emulator's CUDA backend, so it runs in CI): the CUDA backend with fp32, bf16
//   and fp16 storage against the host backend (fp32, the numerical reference). Inputs are drawn
//   in fp32, rounded to the dtype under test, then uploaded to both, so both compute from the
//   same values; outputs are compared with the tolerance their Check names (op_compare.h) or bit
//   for bit.
// - test_host_device: the host backend on three threads against itself on one, bit for bit for
//   every output. Decision: that is what the table can check independently about the host
//   backend (its ops split work by shape, never by thread count, and the pinned trainer losses
//   rely on it). Its numerical reference stays in test_host_device.cpp: every op against
//   float64 scalar references and central finite differences, which need per-op float64 math
//   and small shapes that a cross-backend table has no use for.
//
// Every case runs with its operands at the start of their allocations (aligned: the kernels'
// vector paths) and again one element off (the scalar paths), from the same seed. A case can also
// assert invariants that hold on every backend (a null dbias leaves the bias gradient alone), and
// can ask for a second run on the backend under test to give the same bits.
//
// Adding an op: add its case to op_cases() in op_cases_table.cpp (one entry, or one per shape);
// the three binaries pick it up from there.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "device/device.h"

namespace zo::test {

// How an output is compared with the reference's (tolerances in op_compare.h).
enum class Check {
  kAct,    // act_tol(dtype under test): activations and gradients in the storage dtype
  kStats,  // kStatsTol: fp32 results (statistics, losses, optimizer state)
  kBits,   // bit for bit
};

// A view of device memory owned by the OpRun that made it.
struct Tensor {
  void* p = nullptr;
  std::size_t n = 0;
  zo::DType t = zo::DType::kF32;  // storage
  bool act = false;               // stored in the device's act dtype, values rounded to the case's

  float* f() const { return static_cast<float*>(p); }
  std::int32_t* i() const { return static_cast<std::int32_t*>(p); }
};

struct Output {
  std::string name;
  Check check;
  bool act;
  zo::DType t;
  std::vector<std::uint8_t> bytes;
};

// One execution of a case on one device: draws inputs, uploads them, records outputs. Inputs
// come from a fixed seed in call order, so every run of a case sees the same values.
class OpRun {
 public:
  // `reference`: the reference run's outputs (for from_reference); null in the reference run.
  OpRun(zo::dev::Device& dev, zo::DType t, std::size_t offset,
        const std::vector<Output>* reference = nullptr);
  ~OpRun();  // waits for the stream before the buffers go
  OpRun(const OpRun&) = delete;
  OpRun& operator=(const OpRun&) = delete;

  zo::dev::Device& dev() { return dev_; }
  zo::dev::Stream& s() { return *stream_; }
  zo::DType t() const { return t_; }  // the dtype under test
  std::mt19937& rng() { return rng_; }

  // Normal(shift, scale) values rounded to t(); normal_f32 leaves them unrounded.
  std::vector<float> normal(std::size_t n, float scale = 1.0f, float shift = 0.0f);
  std::vector<float> normal_f32(std::size_t n);
  std::vector<std::int32_t> ids(std::size_t n, int limit);  // uniform in [0, limit)

  Tensor act(const std::vector<float>& x);  // x rounded to t(), stored in the act dtype
  Tensor rand(std::size_t n, float scale = 1.0f, float shift = 0.0f) {
    return act(normal(n, scale, shift));
  }
  Tensor put(const std::vector<float>& x, zo::DType storage);  // exact for representable x
  Tensor f32(const std::vector<float>& x) { return put(x, zo::DType::kF32); }
  Tensor i32(const std::vector<std::int32_t>& x);
  Tensor u64(const std::vector<std::uint64_t>& x);  // 8-byte aligned whatever the offset
  // The reference run's output `name` as an input here (this run's own in the reference run),
  // stored as that output was: the backward ops read the reference's forward results.
  Tensor from_reference(const std::string& name);

  std::vector<float> get(const Tensor& x);
  std::vector<std::uint8_t> raw(const Tensor& x);
  // Records x's current contents as output `name` and returns them.
  std::vector<float> out(const std::string& name, const Tensor& x, Check check);
  const std::vector<Output>& outputs() const { return outputs_; }

 private:
  Tensor alloc(std::size_t n, zo::DType storage, bool act);

  zo::dev::Device& dev_;
  zo::DType t_;
  std::size_t offset_;
  const std::vector<Output>* reference_;
  std::mt19937 rng_;
  std::unique_ptr<zo::dev::Stream> stream_;
  std::vector<zo::dev::Buffer> buffers_;  // every tensor's, released after ~OpRun's wait
  std::vector<Output> outputs_;
};

struct OpCase {
  // The op in CamelCase and its shape, e.g. MatmulForward_N26_C48_OC37: bench/gpu/run.sh picks
  // op tests for the sanitizers by name (Dtypes/*Attention*).
  std::string name;
  std::function<void(OpRun&)> run;
  bool deterministic = false;  // a second run on the backend under test gives the same bits
  bool any_act_dtype = false;  // the op ignores act_dtype(): run once, on an fp32 device
};

// The table (op_cases_table.cpp).
const std::vector<OpCase>& op_cases();

enum class Compare {
  kTolerance,  // each output by its Check
  kBits,       // every output bit for bit (two configurations of one backend)
};

// Runs `c` on `reference`, then on `under_test` (twice when deterministic), at both operand
// offsets, and compares. Both devices store activations in t or in fp32.
void run_op_case(const OpCase& c, zo::DType t, zo::dev::Device& under_test,
                 zo::dev::Device& reference, Compare mode);

// gtest parameters: each case once per dtype, named <case>_<dtype> (any_act_dtype cases once,
// with the first dtype, named <case>).
struct OpCaseParam {
  const OpCase* op;
  zo::DType t;
};
std::vector<OpCaseParam> op_case_params(std::initializer_list<zo::DType> dtypes);
std::string op_case_name(const ::testing::TestParamInfo<OpCaseParam>& info);
void PrintTo(const OpCaseParam& p, std::ostream* os);

// The cast cases' fp32 input: 1001 Normal(0, 100) values with specials at [100, 115): signed
// zeros, fp32/fp16 subnormals, fp16 overflow (65520 is the tie to infinity), bf16 and fp16 ties
// at 1 (1 + 2^-8, 1 + 2^-11), infinities.
std::vector<float> cast_inputs(std::mt19937& rng);

}  // namespace zo::test
