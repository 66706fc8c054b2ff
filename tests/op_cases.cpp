// The op-case runner (op_cases.h): a OpRun's transfers and the comparison of two runs' outputs.
#include "op_cases.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <iterator>
#include <limits>
#include <stdexcept>

#include "op_compare.h"

namespace zo::test {

namespace {

constexpr std::uint32_t kSeed = 20240520;

// Bit for bit, in got's storage (an act output is fp32 on the host and 16-bit on a GPU).
void expect_same_bits(const Output& got, const Output& want, const std::string& what) {
  const std::vector<std::uint8_t> want_bytes =
      got.t == want.t ? want.bytes : encode(decode(want.bytes, want.t), got.t);
  ASSERT_EQ(got.bytes.size(), want_bytes.size()) << what;
  if (got.bytes == want_bytes) return;
  const std::size_t es = zo::dtype_size(got.t);
  const std::vector<float> g = decode(got.bytes, got.t), w = decode(want_bytes, got.t);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::memcmp(&got.bytes[i * es], &want_bytes[i * es], es) == 0) continue;
    if (bad < 5) ADD_FAILURE() << what << "[" << i << "] = " << g[i] << ", want " << w[i];
    ++bad;
  }
  EXPECT_EQ(bad, 0u) << what << ": elements whose bits differ";
}

void compare(const std::vector<Output>& got, const std::vector<Output>& want, DType t, Compare mode,
             const std::string& against) {
  ASSERT_EQ(got.size(), want.size()) << "the runs recorded different outputs (" << against << ")";
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].name, want[i].name) << against;
    const std::string what = got[i].name + " (" + against + ")";
    if (mode == Compare::kBits || got[i].check == Check::kBits) {
      expect_same_bits(got[i], want[i], what);
    } else {
      expect_close(decode(got[i].bytes, got[i].t), decode(want[i].bytes, want[i].t),
                   got[i].check == Check::kAct ? act_tol(t) : kStatsTol, what);
    }
  }
}

}  // namespace

// ---- OpRun
// -----------------------------------------------------------------------------------------

OpRun::OpRun(zo::dev::Device& dev, DType t, std::size_t offset,
             const std::vector<Output>* reference)
    : dev_(dev),
      t_(t),
      offset_(offset),
      reference_(reference),
      rng_(kSeed),
      stream_(dev.create_stream()) {
  if (dev.act_dtype() != t && dev.act_dtype() != DType::kF32) {
    throw std::invalid_argument("op case run: the device stores " +
                                std::string(zo::dtype_name(dev.act_dtype())) + ", not " +
                                std::string(zo::dtype_name(t)) + " or fp32");
  }
}

OpRun::~OpRun() {
  try {
    stream_->synchronize();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "the stream failed at the end of the case: " << e.what();
  }
}

std::vector<float> OpRun::normal(std::size_t n, float scale, float shift) {
  std::normal_distribution<float> normal(shift, scale);
  std::vector<float> x(n);
  for (float& v : x)
    v = normal(rng_);
  return round_to(x, t_);
}

std::vector<float> OpRun::normal_f32(std::size_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x)
    v = normal(rng_);
  return x;
}

std::vector<std::int32_t> OpRun::ids(std::size_t n, int limit) {
  std::uniform_int_distribution<int> pick(0, limit - 1);
  std::vector<std::int32_t> x(n);
  for (auto& v : x)
    v = pick(rng_);
  return x;
}

Tensor OpRun::alloc(std::size_t n, DType storage, bool act) {
  const std::size_t es = zo::dtype_size(storage);
  buffers_.push_back(dev_.alloc((n + offset_) * es, "op case tensor"));
  return Tensor{static_cast<char*>(buffers_.back().data()) + offset_ * es, n, storage, act};
}

Tensor OpRun::put(const std::vector<float>& x, DType storage) {
  Tensor r = alloc(x.size(), storage, false);
  const std::vector<std::uint8_t> bytes = encode(x, storage);
  dev_.copy_to_device(r.p, bytes.data(), bytes.size(), *stream_);
  stream_->synchronize();
  return r;
}

Tensor OpRun::act(const std::vector<float>& x) {
  Tensor r = put(round_to(x, t_), dev_.act_dtype());
  r.act = true;
  return r;
}

Tensor OpRun::i32(const std::vector<std::int32_t>& x) {
  Tensor r = alloc(x.size(), DType::kF32, false);  // 4-byte elements
  dev_.copy_to_device(r.p, x.data(), x.size() * sizeof(std::int32_t), *stream_);
  stream_->synchronize();
  return r;
}

Tensor OpRun::u64(const std::vector<std::uint64_t>& x) {
  // An index table: 8-byte aligned as the ops require, so without the operand offset.
  buffers_.push_back(dev_.alloc(x.size() * sizeof(std::uint64_t), "op case table"));
  const Tensor r{buffers_.back().data(), 2 * x.size(), DType::kF32, false};  // 4-byte elements
  dev_.copy_to_device(r.p, x.data(), x.size() * sizeof(std::uint64_t), *stream_);
  stream_->synchronize();
  return r;
}

Tensor OpRun::from_reference(const std::string& name) {
  const std::vector<Output>& outputs = reference_ != nullptr ? *reference_ : outputs_;
  const auto o =
      std::find_if(outputs.begin(), outputs.end(), [&](const Output& x) { return x.name == name; });
  if (o == outputs.end()) throw std::logic_error("op case: no reference output " + name);
  const std::vector<float> values = decode(o->bytes, o->t);
  return o->act ? act(values) : put(values, o->t);
}

std::vector<std::uint8_t> OpRun::raw(const Tensor& x) {
  std::vector<std::uint8_t> bytes(x.n * zo::dtype_size(x.t));
  dev_.copy_to_host(bytes.data(), x.p, bytes.size(), *stream_);
  stream_->synchronize();
  return bytes;
}

std::vector<float> OpRun::get(const Tensor& x) {
  return decode(raw(x), x.t);
}

std::vector<float> OpRun::out(const std::string& name, const Tensor& x, Check check) {
  for (const Output& o : outputs_)
    EXPECT_NE(o.name, name) << "output names must be unique within a case";
  outputs_.push_back(Output{name, check, x.act, x.t, raw(x)});
  return decode(outputs_.back().bytes, x.t);
}

// ---- the runner
// ----------------------------------------------------------------------------------

void run_op_case(const OpCase& c, DType t, zo::dev::Device& under_test, zo::dev::Device& reference,
                 Compare mode) {
  for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
    SCOPED_TRACE(c.name + ", operands " + (offset == 0 ? "aligned" : "one element off"));
    OpRun want(reference, t, offset);
    c.run(want);
    ASSERT_FALSE(want.outputs().empty()) << "a case must record its outputs";
    OpRun got(under_test, t, offset, &want.outputs());
    c.run(got);
    compare(got.outputs(), want.outputs(), t, mode, "against the reference");
    if (c.deterministic) {
      OpRun again(under_test, t, offset, &want.outputs());
      c.run(again);
      compare(again.outputs(), got.outputs(), t, Compare::kBits, "second run against the first");
    }
  }
}

std::vector<OpCaseParam> op_case_params(std::initializer_list<DType> dtypes) {
  std::vector<OpCaseParam> params;
  for (const OpCase& c : op_cases()) {
    for (const DType t : dtypes) {
      params.push_back({&c, t});
      if (c.any_act_dtype) break;
    }
  }
  return params;
}

std::string op_case_name(const ::testing::TestParamInfo<OpCaseParam>& info) {
  if (info.param.op->any_act_dtype) return info.param.op->name;
  return info.param.op->name + "_" + std::string(zo::dtype_name(info.param.t));
}

void PrintTo(const OpCaseParam& p, std::ostream* os) {
  *os << p.op->name << " (" << zo::dtype_name(p.t) << ")";
}

std::vector<float> cast_inputs(std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 100.0f);
  std::vector<float> x(1001);
  for (float& v : x)
    v = normal(rng);
  const float specials[] = {0.0f,
                            -0.0f,
                            1e-40f,
                            -3e-39f,
                            6e-8f,
                            1e-5f,
                            65504.0f,
                            65520.0f,
                            70000.0f,
                            -1e5f,
                            3e38f,
                            1.00390625f,
                            1.00048828125f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  std::copy(std::begin(specials), std::end(specials), x.begin() + 100);
  return x;
}

}  // namespace zo::test
