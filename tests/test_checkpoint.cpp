// Tests for src/checkpoint: CRC-32C, safetensors reader/writer, atomic files and directories,
// manifests, rotation.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/atomic_io.h"
#include "checkpoint/safetensors.h"
#include "core/crc32c.h"
#include "core/dtype.h"
#include "core/error.h"
#include "file_size_limit.h"

namespace fs = std::filesystem;
using namespace zo::ckpt;
using zo::CheckpointError;
using zo::DType;

namespace {

// ---- helpers ------------------------------------------------------------------------------------

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "zo_ckpt_test_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Plain, non-atomic write: for crafting test inputs only.
void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::string> dir_entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string le64(std::uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i)
    s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

// A safetensors file from a header text and raw data bytes, exactly as given.
std::string st_file(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

// Runs f, expects a CheckpointError, returns its message.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a CheckpointError";
  return {};
}

#define EXPECT_HAS(msg, sub)                               \
  EXPECT_NE(std::string(msg).find(sub), std::string::npos) \
      << "message: " << (msg) << "\nshould contain: " << (sub)

std::uint32_t bits_of(float f) {
  return std::bit_cast<std::uint32_t>(f);
}

std::span<const std::byte> bytes_of(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

// Values over many magnitudes plus the special cases the converters must keep.
std::vector<float> random_values(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mant(-2.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-30, 20);
  std::vector<float> v(n);
  for (auto& x : v)
    x = std::ldexp(mant(rng), expo(rng));
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            70000.0f,         // overflows fp16
                            6.0e-8f,          // fp16 subnormal
                            1.0f + 0x1p-11f,  // fp16 tie, rounds to even
                            1.0f + 0x1p-8f};  // bf16 tie
  for (std::size_t i = 0; i < n && i < std::size(specials); ++i)
    v[i * 7 % n] = specials[i];
  return v;
}

// (Not "t" + to_string(i): GCC 12 warns falsely about it, -Wrestrict.)
std::string tensor_name(std::size_t i) {
  return std::string("t").append(std::to_string(i));
}

std::uint64_t numel(const std::vector<std::uint64_t>& shape) {
  std::uint64_t n = 1;
  for (auto d : shape)
    n *= d;
  return n;
}

// ---- CRC-32C ------------------------------------------------------------------------------------

TEST(Crc32c, KnownVectors) {
  // RFC 3720 B.4 and the common check value; the last two computed bit by bit (independently).
  std::string zeros(32, '\0'), ones(32, '\xFF'), inc(32, '\0'), dec(32, '\0');
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<char>(i);
    dec[i] = static_cast<char>(31 - i);
  }
  const std::pair<std::string, std::uint32_t> cases[] = {
      {"", 0x00000000u},    {"123456789", 0xE3069283u},
      {zeros, 0x8A9136AAu}, {ones, 0x62A8AB43u},
      {inc, 0x46DD794Eu},   {dec, 0x113FDB5Cu},
      {"a", 0xC1D04330u},   {"The quick brown fox jumps over the lazy dog", 0x22620404u},
  };
  for (const auto& [text, want] : cases) {
    EXPECT_EQ(zo::crc32c(text), want) << "'" << text << "'";
    EXPECT_EQ(zo::detail::crc32c_table(bytes_of(text), 0), want);
    if (zo::detail::crc32c_hw_available()) {
      EXPECT_EQ(zo::detail::crc32c_hw(bytes_of(text), 0), want);
    }
  }
}

TEST(Crc32c, ImplementationsAgreeAndAreIncremental) {
  std::mt19937 rng(7);
  std::vector<std::byte> buf(100003);
  for (auto& b : buf)
    b = static_cast<std::byte>(rng());
  const std::span<const std::byte> all(buf);
  // Lengths around the hardware path's block sizes (3 x 256 and 3 x 8192 bytes).
  for (std::size_t off : {0u, 1u, 3u, 7u, 8u}) {
    for (std::size_t len : {0u, 1u, 7u, 8u, 9u, 63u, 767u, 768u, 775u, 4096u, 24575u, 24576u,
                            24583u, 25344u, 49152u, 99000u}) {
      const auto s = all.subspan(off, len);
      const std::uint32_t ref = zo::detail::crc32c_table(s, 0);
      EXPECT_EQ(zo::crc32c(s), ref) << off << "+" << len;
      if (zo::detail::crc32c_hw_available()) {
        EXPECT_EQ(zo::detail::crc32c_hw(s, 0), ref);
      }
    }
  }
  const std::uint32_t whole = zo::crc32c(all);
  for (std::size_t cut : {0u, 1u, 5000u, 100002u}) {
    EXPECT_EQ(zo::crc32c(all.subspan(cut), zo::crc32c(all.first(cut))), whole) << cut;
    EXPECT_EQ(
        zo::detail::crc32c_table(all.subspan(cut), zo::detail::crc32c_table(all.first(cut), 0)),
        whole);
  }
}

TEST(Crc32c, Throughput) {
  std::vector<std::byte> buf(64u << 20, std::byte{0x5A});
  auto t0 = std::chrono::steady_clock::now();
  const std::uint32_t c = zo::crc32c(buf);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  t0 = std::chrono::steady_clock::now();
  const std::uint32_t c2 = zo::detail::crc32c_table(buf, 0);
  const double s2 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(c, c2);
  std::printf("crc32c: %.2f GB/s (%s), slicing-by-8 table: %.2f GB/s\n", 0.064 / s * 1.048576,
              zo::detail::crc32c_hw_available() ? "SSE4.2" : "table", 0.064 / s2 * 1.048576);
}

// ---- safetensors: round trips -------------------------------------------------------------------

TEST(Safetensors, RoundTripEveryDtypeBitExact) {
  TempDir tmp;
  const std::vector<std::vector<std::uint64_t>> shapes = {{7, 13}, {1}, {3, 5, 2}, {}, {4, 0}};
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    std::vector<std::vector<float>> data;  // the writer keeps spans: stable storage
    data.reserve(shapes.size());
    SafetensorsWriter w;
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      data.push_back(random_values(numel(shapes[i]), static_cast<std::uint32_t>(i + 100)));
      w.add(tensor_name(i), shapes[i], data.back(), dt);
    }
    const fs::path p = tmp / "m.safetensors";
    w.write(p);
    EXPECT_EQ(fs::file_size(p), w.file_size());

    const SafetensorsFile f = SafetensorsFile::open(p);
    ASSERT_EQ(f.tensors().size(), shapes.size());
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const std::string name = tensor_name(i);
      const TensorInfo& info = f.info(name);
      EXPECT_EQ(info.dtype, dt);
      EXPECT_EQ(info.dtype_name, safetensors_dtype_name(dt));
      EXPECT_EQ(info.shape, shapes[i]);
      f.expect_shape(name, shapes[i]);
      std::vector<float> back(data[i].size(), -1.0f);
      f.read_f32(name, back);
      for (std::size_t k = 0; k < back.size(); ++k) {
        const float x = data[i][k];
        const float want = dt == DType::kF32   ? x
                           : dt == DType::kF16 ? zo::half_to_float(zo::float_to_half(x))
                                               : zo::bf16_to_float(zo::float_to_bf16(x));
        ASSERT_EQ(bits_of(back[k]), bits_of(want))
            << zo::dtype_name(dt) << " " << name << "[" << k << "] = " << x;
      }
      if (dt != DType::kF32) {  // the stored 16-bit words are exactly the converters' output
        std::vector<std::uint16_t> words(data[i].size());
        f.read_u16(name, words, dt);
        for (std::size_t k = 0; k < words.size(); ++k) {
          const std::uint16_t want =
              dt == DType::kF16 ? zo::float_to_half(data[i][k]) : zo::float_to_bf16(data[i][k]);
          ASSERT_EQ(words[k], want) << name << "[" << k << "]";
        }
      }
    }
  }
}

TEST(Safetensors, MixedDtypesAndConversionsOnRead) {
  TempDir tmp;
  const auto a = random_values(91, 1), b = random_values(30, 2);
  std::vector<std::uint16_t> bf(17);
  for (std::size_t i = 0; i < bf.size(); ++i)
    bf[i] = zo::float_to_bf16(0.25f * float(i) - 2.0f);
  SafetensorsWriter w;
  w.add("h.0.attn.c_attn.weight", {7, 13}, a, DType::kF32);
  w.add("h.0.ln_1.bias", {3, 5, 2}, b, DType::kF16);
  w.add_u16("exp_avg", {17}, bf, DType::kBF16);
  w.write(tmp / "x.safetensors");
  const auto f = SafetensorsFile::open(tmp / "x.safetensors");

  std::vector<std::uint16_t> out(91);
  f.read_u16("h.0.attn.c_attn.weight", out, DType::kBF16);  // F32 -> BF16, rounded
  for (std::size_t i = 0; i < out.size(); ++i)
    EXPECT_EQ(out[i], zo::float_to_bf16(a[i]));
  std::vector<std::uint16_t> out2(30);
  f.read_u16("h.0.ln_1.bias", out2, DType::kBF16);  // F16 -> BF16 through fp32
  for (std::size_t i = 0; i < out2.size(); ++i) {
    EXPECT_EQ(out2[i], zo::float_to_bf16(zo::half_to_float(zo::float_to_half(b[i]))));
  }
  std::vector<std::uint16_t> out3(17);
  f.read_u16("exp_avg", out3, DType::kBF16);  // add_u16: bit for bit
  EXPECT_EQ(out3, bf);
  EXPECT_EQ(f.names(),
            (std::vector<std::string>{"exp_avg", "h.0.attn.c_attn.weight", "h.0.ln_1.bias"}));
}

TEST(Safetensors, MetadataRoundTrip) {
  TempDir tmp;
  const std::vector<float> v = {1, 2, 3};
  SafetensorsWriter w;
  w.add("w", {3}, v);
  w.set_metadata("format", "pt");
  w.set_metadata("step", "1000");
  w.set_metadata("empty", "");
  w.set_metadata("unicode", "λ = 0.1 \"quoted\"\n");
  w.write(tmp / "m.safetensors");
  const auto f = SafetensorsFile::open(tmp / "m.safetensors");
  const std::map<std::string, std::string> want = {
      {"format", "pt"}, {"step", "1000"}, {"empty", ""}, {"unicode", "λ = 0.1 \"quoted\"\n"}};
  EXPECT_EQ(f.metadata(), want);

  SafetensorsWriter w2;  // no metadata set: format=pt all the same (transformers needs it)
  w2.add("w", {3}, v);
  w2.write(tmp / "n.safetensors");
  EXPECT_EQ(SafetensorsFile::open(tmp / "n.safetensors").metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}}));
  SafetensorsWriter w3;  // the caller's format wins
  w3.add("w", {3}, v);
  w3.set_metadata("format", "offload_train");
  EXPECT_NE(w3.header().find(R"("format":"offload_train")"), std::string::npos);
  // A file without __metadata__ at all reads as empty metadata.
  write_bytes(tmp / "bare.safetensors",
              st_file(R"({"w":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})", "abcd"));
  EXPECT_TRUE(SafetensorsFile::open(tmp / "bare.safetensors").metadata().empty());
}

TEST(Safetensors, HeaderIsPaddedTo8AndOutputIsDeterministic) {
  TempDir tmp;
  for (int extra = 0; extra < 8; ++extra) {  // name lengths shift the JSON length through all
    const std::vector<float> v(5, 1.5f);
    SafetensorsWriter w;
    w.add("name" + std::string(extra, 'x'), {5}, v, DType::kF16);
    const fs::path p = tmp / "p.safetensors";
    w.write(p);
    const std::string bytes = read_bytes(p);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i)
      n = (n << 8) | static_cast<unsigned char>(bytes[i]);
    EXPECT_EQ(n % 8, 0u);
    const std::string header = bytes.substr(8, n);
    const auto last = header.find_last_not_of(' ');
    EXPECT_EQ(header[last], '}');
    EXPECT_TRUE(nlohmann::json::accept(header));
    EXPECT_EQ(bytes.size(), 8 + n + 10);
  }
  // Same content added in a different order gives the same bytes.
  const auto a = random_values(20, 3), b = random_values(6, 4);
  SafetensorsWriter w1, w2;
  w1.add("b", {2, 3}, b, DType::kBF16);
  w1.add("a", {20}, a);
  w1.set_metadata("k", "v");
  w2.set_metadata("k", "v");
  w2.add("a", {20}, a);
  w2.add("b", {2, 3}, b, DType::kBF16);
  w1.write(tmp / "1.safetensors");
  w2.write(tmp / "2.safetensors");
  EXPECT_EQ(read_bytes(tmp / "1.safetensors"), read_bytes(tmp / "2.safetensors"));
}

// A file laid out by hand from the format description, independent of SafetensorsWriter: out-of-
// order keys, metadata in the middle, whitespace, trailing-space padding, hand-encoded values.
TEST(Safetensors, ReadsHandBuiltSpecFile) {
  TempDir tmp;
  std::string header =
      "{\"b\": {\"dtype\": \"F16\", \"shape\": [1, 2], \"data_offsets\": [8, 12]},\n"
      " \"__metadata__\": {\"format\": \"pt\"},\n"
      " \"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},\n"
      " \"c\": {\"shape\": [2], \"dtype\": \"BF16\", \"data_offsets\": [12, 16]},\n"
      " \"empty\": {\"dtype\": \"F32\", \"shape\": [0, 3], \"data_offsets\": [16, 16]}}";
  header.append(8 - header.size() % 8, ' ');
  const std::string data = std::string("\x00\x00\x80\x3F", 4) +  // a[0] = 1.0f   (0x3F800000)
                           std::string("\x00\x00\x20\xC0", 4) +  // a[1] = -2.5f  (0xC0200000)
                           std::string("\x00\x3C", 2) +          // b[0] = 1.0    (fp16 0x3C00)
                           std::string("\x00\xB8", 2) +          // b[1] = -0.5   (fp16 0xB800)
                           std::string("\x40\x40", 2) +          // c[0] = 3.0    (bf16 0x4040)
                           std::string("\x80\xBF", 2);           // c[1] = -1.0   (bf16 0xBF80)
  write_bytes(tmp / "hand.safetensors", st_file(header, data));

  const auto f = SafetensorsFile::open(tmp / "hand.safetensors");
  EXPECT_EQ(f.header_size(), header.size());
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b", "c", "empty"}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  std::vector<float> a(2), b(2), c(2), e;
  f.read_f32("a", a);
  f.read_f32("b", b);
  f.read_f32("c", c);
  f.read_f32("empty", e);
  EXPECT_EQ(a, (std::vector<float>{1.0f, -2.5f}));
  EXPECT_EQ(b, (std::vector<float>{1.0f, -0.5f}));
  EXPECT_EQ(c, (std::vector<float>{3.0f, -1.0f}));
  f.expect_shape("b", {1, 2});
  EXPECT_EQ(f.info("c").data_begin, 12u);
}

// ---- safetensors: bad input ---------------------------------------------------------------------

struct BadFile {
  const char* what;
  std::string bytes;
  std::vector<std::string> expect;  // substrings of the message
};

TEST(Safetensors, RejectsMalformedFiles) {
  TempDir tmp;
  auto t = [](const std::string& body) { return "{" + body + "}"; };
  const std::string f32x2 = R"("dtype":"F32","shape":[2])";
  const std::vector<BadFile> cases = {
      {"empty", "", {"too small (0 bytes)"}},
      {"5 bytes", "abcde", {"too small (5 bytes)"}},
      {"absurd length", le64(1ull << 40) + "{}", {"header length 1099511627776", "absurd"}},
      {"above 100 MB", le64((100ull << 20) + 1) + "{}", {"absurd", "limit"}},
      {"length > file", le64(1000) + "{}", {"header length 1000", "exceeds the file"}},
      {"invalid JSON", st_file(R"({"a": {"dtype": )", ""), {"not valid JSON"}},
      {"zero-length header", st_file("", ""), {"not valid JSON"}},
      {"not an object", st_file("[1, 2]", ""), {"must be a JSON object", "array"}},
      {"entry not object", st_file(t(R"("w": 5)"), ""), {"tensor 'w'", "entry is a number"}},
      {"missing dtype",
       st_file(t(R"("w": {"shape":[1],"data_offsets":[0,4]})"), "1234"),
       {"tensor 'w'", "\"dtype\""}},
      {"unknown dtype",
       st_file(t(R"("w": {"dtype":"F31","shape":[1],"data_offsets":[0,4]})"), "1234"),
       {"tensor 'w'", "unknown dtype 'F31'"}},
      {"negative dim",
       st_file(t(R"("w": {"dtype":"F32","shape":[-1],"data_offsets":[0,4]})"), "1234"),
       {"tensor 'w'", "non-negative"}},
      {"shape overflow",
       st_file(t(R"("w": {"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]})"),
               "1234"),
       {"tensor 'w'", "overflow"}},
      {"bad offsets arity",
       st_file(t(R"("w": {"dtype":"F32","shape":[1],"data_offsets":[0]})"), "1234"),
       {"tensor 'w'", "data_offsets"}},
      {"offsets reversed",
       st_file(t(R"("w": {"dtype":"F32","shape":[0],"data_offsets":[4,0]})"), "1234"),
       {"tensor 'w'", "end before they begin"}},
      {"shape/bytes mismatch",
       st_file(t(R"("w": {"dtype":"F32","shape":[3],"data_offsets":[0,8]})"), "12345678"),
       {"tensor 'w'", "[3] of F32 needs 12 bytes", "span 8 bytes"}},
      {"out of bounds",
       st_file(t(R"("w": {)" + f32x2 + R"(,"data_offsets":[0,8]})"), "1234"),
       {"tensor 'w'", "past the end of the data section (4 bytes)"}},
      {"overlap",
       st_file(t(R"("a": {)" + f32x2 + R"(,"data_offsets":[0,8]}, "b": {)" + f32x2 +
                 R"(,"data_offsets":[4,12]})"),
               "123456789012"),
       {"tensor 'b'", "overlap tensor 'a'"}},
      {"gap",
       st_file(t(R"("a": {"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                 R"("b": {"dtype":"F32","shape":[1],"data_offsets":[8,12]})"),
               "123456789012"),
       {"tensor 'b'", "gap of 4 bytes", "after tensor 'a'"}},
      {"gap at start",
       st_file(t(R"("a": {"dtype":"F32","shape":[1],"data_offsets":[4,8]})"), "12345678"),
       {"tensor 'a'", "gap of 4 bytes", "start of the data"}},
      {"uncovered tail",
       st_file(t(R"("a": {"dtype":"F32","shape":[1],"data_offsets":[0,4]})"), "12345678"),
       {"4 bytes after the last tensor"}},
      {"metadata not string",
       st_file(t(R"("__metadata__": {"k": 1})"), ""),
       {"__metadata__", "'k'", "number"}},
      {"metadata not object", st_file(t(R"("__metadata__": [1])"), ""), {"__metadata__"}},
  };
  for (const BadFile& c : cases) {
    SCOPED_TRACE(c.what);
    const fs::path p = tmp / "bad.safetensors";
    write_bytes(p, c.bytes);
    const std::string msg = error_of([&] { (void)SafetensorsFile::open(p); });
    EXPECT_HAS(msg, p.string());  // every message names the file
    for (const auto& s : c.expect)
      EXPECT_HAS(msg, s);
  }
}

TEST(Safetensors, TruncatedWriterOutputIsRejected) {
  TempDir tmp;
  const auto v = random_values(100, 5);
  SafetensorsWriter w;
  w.add("w", {10, 10}, v);
  w.write(tmp / "t.safetensors");
  std::string bytes = read_bytes(tmp / "t.safetensors");
  bytes.pop_back();
  write_bytes(tmp / "t.safetensors", bytes);
  EXPECT_HAS(error_of([&] { (void)SafetensorsFile::open(tmp / "t.safetensors"); }),
             "past the end of the data section");
}

TEST(Safetensors, UnsupportedDtypesAreListedButNotRead) {
  TempDir tmp;
  const std::string header = R"({"d": {"dtype":"F64","shape":[2],"data_offsets":[0,16]},)"
                             R"("i": {"dtype":"I64","shape":[1],"data_offsets":[16,24]},)"
                             R"("f": {"dtype":"F32","shape":[1],"data_offsets":[24,28]}})";
  write_bytes(tmp / "u.safetensors",
              st_file(header, std::string(24, '\0') + std::string("\x00\x00\x80\x3F", 4)));
  const auto f = SafetensorsFile::open(tmp / "u.safetensors");
  EXPECT_EQ(f.info("d").dtype_name, "F64");
  EXPECT_FALSE(f.info("d").dtype.has_value());
  std::vector<float> out(2);
  std::string msg = error_of([&] { f.read_f32("d", out); });
  EXPECT_HAS(msg, "tensor 'd'");
  EXPECT_HAS(msg, "dtype F64 is not supported (supported: F32, F16, BF16)");
  std::vector<float> one(1);
  EXPECT_HAS(error_of([&] { f.read_f32("i", one); }), "dtype I64 is not supported");
  f.read_f32("f", one);
  EXPECT_EQ(one[0], 1.0f);
}

// A tensor whose data a Fill produces in pieces writes the same bytes as one added whole, in
// every dtype, for sizes around the fill's piece; every piece asked for is in order and bounded.
TEST(Safetensors, FilledTensorsWriteWhatAddWrites) {
  TempDir tmp;
  const std::size_t K = SafetensorsWriter::kFillElements;
  for (const std::size_t n : {std::size_t{1}, K - 1, K, 2 * K + 5}) {
    const auto v = random_values(n, static_cast<std::uint32_t>(n));
    for (const DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
      SafetensorsWriter whole, filled;
      whole.add("b", {n}, v, dt);
      whole.add("a", {1, n}, v, dt);
      std::uint64_t next = 0;
      const auto fill = [&](std::uint64_t first, std::span<std::byte> out) {
        const std::size_t k = out.size() / zo::dtype_size(dt);
        EXPECT_EQ(first, next % n);
        EXPECT_LE(k, K);
        next += k;
        zo::convert_from_float(v.data() + first, out.data(), dt, k);
      };
      filled.add_filled("b", {n}, dt, fill);
      filled.add_filled("a", {1, n}, dt, fill);
      whole.write(tmp / "whole.safetensors");
      filled.write(tmp / "filled.safetensors");
      EXPECT_EQ(read_bytes(tmp / "filled.safetensors"), read_bytes(tmp / "whole.safetensors"))
          << n << " " << zo::dtype_name(dt);
      EXPECT_EQ(next, 2 * n);
    }
  }
}

// A range of a tensor reads as that slice of the whole, converted alike; a range past the end is
// refused.
TEST(Safetensors, RangesReadAsSlicesOfTheWhole) {
  TempDir tmp;
  const auto v = random_values(1000, 7);
  SafetensorsWriter w;
  w.add("f32", {10, 100}, v, DType::kF32);
  w.add("bf16", {1000}, v, DType::kBF16);
  w.write(tmp / "r.safetensors");
  const auto f = SafetensorsFile::open(tmp / "r.safetensors");
  for (const char* name : {"f32", "bf16"}) {
    std::vector<float> all(1000);
    f.read_f32(name, all);
    std::vector<std::uint16_t> all16(1000);
    f.read_u16(name, all16, DType::kF16);
    for (const auto& [first, count] : {std::pair{0, 1000}, {0, 1}, {999, 1}, {313, 211}}) {
      std::vector<float> part(count);
      f.read_f32(name, part, first);
      EXPECT_EQ(std::memcmp(part.data(), all.data() + first, part.size() * 4), 0)  // NaN too
          << name << " " << first;
      std::vector<std::uint16_t> part16(count);
      f.read_u16(name, part16, DType::kF16, first);
      EXPECT_TRUE(std::equal(part16.begin(), part16.end(), all16.begin() + first)) << name;
    }
    std::vector<float> two(2);
    EXPECT_HAS(error_of([&] { f.read_f32(name, two, 999); }),
               "destination holds 2 elements from element 999, the tensor has 1000");
  }
}

TEST(Safetensors, LookupShapeAndSizeErrors) {
  TempDir tmp;
  const auto v = random_values(91, 6);
  SafetensorsWriter w;
  w.add("wte.weight", {7, 13}, v);
  w.write(tmp / "s.safetensors");
  const auto f = SafetensorsFile::open(tmp / "s.safetensors");
  EXPECT_TRUE(f.contains("wte.weight"));
  EXPECT_FALSE(f.contains("wpe.weight"));
  std::string msg = error_of([&] { (void)f.info("wpe.weight"); });
  EXPECT_HAS(msg, "no tensor named 'wpe.weight'");
  EXPECT_HAS(msg, "'wte.weight'");
  f.expect_shape("wte.weight", {7, 13});
  msg = error_of([&] { f.expect_shape("wte.weight", {13, 7}); });
  EXPECT_HAS(msg, "tensor 'wte.weight'");
  EXPECT_HAS(msg, "has shape [7, 13], expected [13, 7]");
  std::vector<float> small(90);
  EXPECT_HAS(error_of([&] { f.read_f32("wte.weight", small); }),
             "destination holds 90 elements, the tensor has 91");
  EXPECT_HAS(error_of([&] { (void)SafetensorsFile::open(tmp / "nope.safetensors"); }),
             "cannot open");
  EXPECT_HAS(error_of([&] { (void)SafetensorsFile::open(tmp.path()); }), "not a regular file");
}

TEST(Safetensors, WriterRejectsBadTensors) {
  const std::vector<float> v(6);
  SafetensorsWriter w;
  w.add("a", {2, 3}, v);
  EXPECT_HAS(error_of([&] { w.add("a", {6}, v); }), "added twice");
  EXPECT_HAS(error_of([&] { w.add("b", {4}, v); }), "shape [4] (4 elements) but 6 values");
  EXPECT_HAS(error_of([&] { w.add("__metadata__", {6}, v); }), "invalid tensor name");
  EXPECT_HAS(error_of([&] { w.add("", {6}, v); }), "invalid tensor name");
}

// ---- atomic files -------------------------------------------------------------------------------

TEST(AtomicFile, WritesAndReplaces) {
  TempDir tmp;
  const fs::path p = tmp / "state.json";
  write_file_atomic(p, std::string_view("old"));
  EXPECT_EQ(read_file(p), "old");
  write_file_atomic(p, [](const ByteSink& sink) {
    for (int i = 0; i < 1000; ++i)
      sink(bytes_of(std::to_string(i % 10)));
  });
  EXPECT_EQ(read_file(p).size(), 1000u);
  EXPECT_EQ(dir_entries(tmp.path()), std::vector<std::string>{"state.json"});
}

// A rename that fails half way (here a missing finished file) puts every replaced and retired
// file back; on success the previous versions wait in the source folder under ".previous-" names.
TEST(AtomicFile, ReplaceFilesIsUndoneWhenARenameFails) {
  TempDir d;
  const fs::path from = d / "from", to = d / "to";
  fs::create_directories(from);
  fs::create_directories(to);
  write_bytes(to / "a.bin", "old a");
  write_bytes(to / "index", "old index");
  write_bytes(to / "keep", "a user's");
  write_bytes(from / "a.bin", "new a");
  const std::string names[] = {"a.bin", "b.bin", "index"}, retire[] = {"index"};
  EXPECT_THROW(replace_files(from, names, to, retire), CheckpointError);
  EXPECT_EQ(dir_entries(to), (std::vector<std::string>{"a.bin", "index", "keep"}));
  EXPECT_EQ(read_bytes(to / "a.bin"), "old a");
  EXPECT_EQ(read_bytes(to / "index"), "old index");
  EXPECT_EQ(dir_entries(from), (std::vector<std::string>{"a.bin"}));
  EXPECT_EQ(read_bytes(from / "a.bin"), "new a");

  write_bytes(from / "b.bin", "new b");
  const std::string two[] = {"a.bin", "b.bin"};
  replace_files(from, two, to, retire);
  EXPECT_EQ(dir_entries(to), (std::vector<std::string>{"a.bin", "b.bin", "keep"}));
  EXPECT_EQ(read_bytes(to / "a.bin"), "new a");
  EXPECT_EQ(read_bytes(from / ".previous-a.bin"), "old a");
  EXPECT_EQ(read_bytes(from / ".previous-index"), "old index");
}

TEST(AtomicFile, FailingProducerLeavesOldFileAndNoTemp) {
  TempDir tmp;
  const fs::path p = tmp / "model.safetensors";
  write_file_atomic(p, std::string_view("precious"));
  const std::string big(3u << 20, 'x');  // larger than the writer's buffer: really hits the disk
  EXPECT_THROW(write_file_atomic(p,
                                 [&](const ByteSink& sink) {
                                   sink(bytes_of(big));
                                   sink(bytes_of(big));
                                   throw std::runtime_error("boom");
                                 }),
               std::runtime_error);
  EXPECT_EQ(read_file(p), "precious");
  EXPECT_EQ(dir_entries(tmp.path()), std::vector<std::string>{"model.safetensors"});
}

TEST(AtomicFile, UnwritableDirectory) {
  TempDir tmp;
  const fs::path dir = tmp / "ro";
  fs::create_directory(dir);
  write_file_atomic(dir / "f", std::string_view("old"));
  fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec);
  // root (and CAP_DAC_OVERRIDE) ignores permission bits: probe before relying on them.
  const bool writable = ::access(dir.c_str(), W_OK) == 0;
  if (writable) {
    fs::permissions(dir, fs::perms::owner_all);
    GTEST_SKIP() << "running as root/with CAP_DAC_OVERRIDE: a read-only directory is still "
                    "writable, so EACCES cannot be produced this way";
  }
  const std::string msg = error_of([&] { write_file_atomic(dir / "f", std::string_view("new")); });
  fs::permissions(dir, fs::perms::owner_all);
  EXPECT_HAS(msg, dir.string());
  EXPECT_HAS(msg, "Permission denied");
  EXPECT_HAS(msg, "Fix the permissions of");
  EXPECT_EQ(read_file(dir / "f"), "old");
  EXPECT_EQ(dir_entries(dir), std::vector<std::string>{"f"});
}

// RLIMIT_FSIZE makes write() fail with EFBIG once SIGXFSZ is ignored; unlike permissions, this
// also works as root. Stands in for a full disk (same code path: a failing write()).
TEST(AtomicFile, WriteErrorMidwayLeavesOldFile) {
  TempDir tmp;
  const fs::path p = tmp / "model.safetensors";
  write_file_atomic(p, std::string_view("precious"));
  std::string msg;
  {
    const zo::test::FileSizeLimit limit(64u << 10);
    if (!limit.active()) GTEST_SKIP() << "cannot lower RLIMIT_FSIZE here";
    const std::string big(1u << 20, 'y');
    msg = error_of([&] { write_file_atomic(p, bytes_of(big)); });
  }
  EXPECT_HAS(msg, p.string());
  EXPECT_HAS(msg, "File too large");
  EXPECT_HAS(msg, "ulimit -f");
  EXPECT_EQ(read_file(p), "precious");
  EXPECT_EQ(dir_entries(tmp.path()), std::vector<std::string>{"model.safetensors"});
}

// A real ENOSPC needs a tiny file system; mounting one needs CAP_SYS_ADMIN (skipped otherwise).
TEST(AtomicFile, DiskFullOnTinyTmpfs) {
  TempDir tmp;
  const fs::path mnt = tmp / "mnt";
  fs::create_directory(mnt);
  if (::mount("zo_test_tmpfs", mnt.c_str(), "tmpfs", 0, "size=256k") != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs here (" << std::strerror(errno)
                 << "); ENOSPC is covered by the EFBIG test's identical code path";
  }
  struct Unmount {
    fs::path m;
    ~Unmount() { ::umount2(m.c_str(), MNT_DETACH); }
  } unmount{mnt};
  const fs::path p = mnt / "ckpt.bin";
  write_file_atomic(p, std::string_view("precious"));
  const std::string big(1u << 20, 'z');
  const std::string msg = error_of([&] { write_file_atomic(p, bytes_of(big)); });
  EXPECT_HAS(msg, "No space left on device");
  EXPECT_HAS(msg, "Free disk space");
  EXPECT_EQ(read_file(p), "precious");
  EXPECT_EQ(dir_entries(mnt), std::vector<std::string>{"ckpt.bin"});
}

TEST(AtomicFile, MissingDirectory) {
  TempDir tmp;
  const std::string msg =
      error_of([&] { write_file_atomic(tmp / "no/such/dir/f", std::string_view("x")); });
  EXPECT_HAS(msg, "No such file or directory");
  EXPECT_HAS(msg, "Create the directory");
}

// ---- AtomicDirectory ----------------------------------------------------------------------------

TEST(AtomicDirectoryTest, CommitPublishesCompleteDirectoryWithManifest) {
  TempDir tmp;
  const fs::path final_dir = tmp / "step_00000100";
  const auto v = random_values(91, 9);
  fs::path temp;
  {
    AtomicDirectory d(final_dir);
    temp = d.temp_path();
    EXPECT_EQ(temp.parent_path(), tmp.path());
    EXPECT_EQ(temp.filename().string().rfind(".step_00000100.tmp-", 0), 0u);
    SafetensorsWriter w;
    w.add("wte.weight", {7, 13}, v, DType::kBF16);
    d.write_file("model.safetensors", [&](const ByteSink& s) { w.stream(s); });
    d.write_file("trainer_state.json", std::string_view(R"({"step": 100})"));
    d.write_file("rng/host.bin", std::string_view("abc"));
    write_bytes(d.temp_path() / "external.txt", "made elsewhere");  // not through write_file
    EXPECT_FALSE(fs::exists(final_dir));
    EXPECT_EQ(latest_checkpoint(tmp.path(), "step_"), std::nullopt);
    d.commit();
    EXPECT_TRUE(d.committed());
  }
  EXPECT_FALSE(fs::exists(temp));
  EXPECT_EQ(dir_entries(tmp.path()), std::vector<std::string>{"step_00000100"});
  const Manifest m = verify_directory(final_dir);
  ASSERT_EQ(m.files.size(), 4u);
  const std::vector<std::string> names = {"external.txt", "model.safetensors", "rng/host.bin",
                                          "trainer_state.json"};
  for (std::size_t i = 0; i < m.files.size(); ++i) {
    EXPECT_EQ(m.files[i].path, names[i]);
    const std::string content = read_bytes(final_dir / names[i]);
    EXPECT_EQ(m.files[i].size, content.size());
    EXPECT_EQ(m.files[i].crc32c, zo::crc32c(content)) << names[i];
  }
  const auto manifest = nlohmann::json::parse(read_file(final_dir / "MANIFEST.json"));
  EXPECT_EQ(manifest["files"][1]["crc32c"].get<std::string>().size(), 8u);
  const auto f = SafetensorsFile::open(final_dir / "model.safetensors");
  std::vector<float> back(91);
  f.read_f32("wte.weight", back);
  EXPECT_EQ(back[3], zo::bf16_to_float(zo::float_to_bf16(v[3])));
  EXPECT_EQ(latest_checkpoint(tmp.path(), "step_"), final_dir);
}

TEST(AtomicDirectoryTest, DestructorWithoutCommitRemovesTemp) {
  TempDir tmp;
  try {
    AtomicDirectory d(tmp / "step_00000001");
    d.write_file("a.bin", std::string_view("partial"));
    throw std::runtime_error("training crashed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_TRUE(dir_entries(tmp.path()).empty());
}

TEST(AtomicDirectoryTest, RefusesToOverwriteUnlessAsked) {
  TempDir tmp;
  const fs::path final_dir = tmp / "ckpt";
  {
    AtomicDirectory d(final_dir);
    d.write_file("v", std::string_view("1"));
    d.commit();
  }
  EXPECT_HAS(error_of([&] { AtomicDirectory d(final_dir); }), "already exists");
  // Someone creates the final directory after we started: commit must not clobber it.
  const fs::path other = tmp / "late";
  {
    AtomicDirectory d(other);
    d.write_file("v", std::string_view("mine"));
    fs::create_directory(other);
    write_bytes(other / "theirs", "keep me");
    EXPECT_HAS(error_of([&] { d.commit(); }), "already exists");
  }
  EXPECT_EQ(dir_entries(other), std::vector<std::string>{"theirs"});
  EXPECT_EQ(dir_entries(tmp.path()), (std::vector<std::string>{"ckpt", "late"}));
  // kReplace swaps the new one in and removes the old one.
  {
    AtomicDirectory d(final_dir, IfExists::kReplace);
    d.write_file("v", std::string_view("2"));
    d.commit();
  }
  EXPECT_EQ(read_file(final_dir / "v"), "2");
  verify_directory(final_dir);
  EXPECT_EQ(dir_entries(tmp.path()), (std::vector<std::string>{"ckpt", "late"}));
  // ... but only a complete checkpoint: a directory without a manifest ("late", someone else's)
  // or a file in the way stays as it was, and the new one is discarded.
  for (const fs::path& in_the_way : {other, fs::path(tmp / "file")}) {
    if (in_the_way == other) {
      ASSERT_TRUE(fs::is_directory(other));
    } else {
      write_bytes(in_the_way, "keep me too");
    }
    AtomicDirectory d(in_the_way, IfExists::kReplace);
    d.write_file("v", std::string_view("3"));
    EXPECT_HAS(error_of([&] { d.commit(); }), "not a complete checkpoint");
  }
  EXPECT_EQ(dir_entries(other), std::vector<std::string>{"theirs"});
  EXPECT_EQ(read_file(tmp / "file"), "keep me too");
}

// The same guarantees where renameat2's flags are missing (older kernels, some network file
// systems): check-then-rename, and move-aside-then-rename for kReplace.
TEST(AtomicDirectoryTest, FallbackWithoutRenameat2Flags) {
  struct Reset {
    ~Reset() { detail::simulate_missing_renameat2_flags(false); }
  } reset;
  detail::simulate_missing_renameat2_flags(true);
  TempDir tmp;
  const fs::path final_dir = tmp / "step_00000007";
  {
    AtomicDirectory d(final_dir);
    d.write_file("v", std::string_view("1"));
    d.commit();
  }
  {
    AtomicDirectory d(tmp / "late");
    d.write_file("v", std::string_view("mine"));
    fs::create_directory(tmp / "late");
    EXPECT_HAS(error_of([&] { d.commit(); }), "already exists");
  }
  {
    AtomicDirectory d(final_dir, IfExists::kReplace);
    d.write_file("v", std::string_view("2"));
    d.commit();
  }
  EXPECT_EQ(read_file(final_dir / "v"), "2");
  verify_directory(final_dir);
  EXPECT_EQ(dir_entries(tmp.path()), (std::vector<std::string>{"late", "step_00000007"}));
  EXPECT_TRUE(dir_entries(tmp / "late").empty());
}

TEST(AtomicDirectoryTest, RejectsBadNamesAndMisuse) {
  TempDir tmp;
  AtomicDirectory d(tmp / "c");
  for (const char* bad : {"../escape", "/abs", "MANIFEST.json", "", "a/../../b"}) {
    EXPECT_HAS(error_of([&] { d.write_file(bad, std::string_view("x")); }), "invalid file name");
  }
  AtomicDirectory moved(std::move(d));
  moved.write_file("ok", std::string_view("x"));
  moved.commit();
  EXPECT_HAS(error_of([&] { moved.commit(); }), "commit called twice");
  EXPECT_HAS(error_of([&] { d.commit(); }), "moved-from");
  verify_directory(tmp / "c");
}

TEST(AtomicDirectoryTest, CreatesMissingParent) {
  TempDir tmp;
  AtomicDirectory d(tmp / "a/b/step_00000005");
  d.write_file("x", std::string_view("1"));
  d.commit();
  EXPECT_EQ(latest_checkpoint(tmp / "a/b", "step_"), tmp / "a/b/step_00000005");
}

// ---- verify_directory ---------------------------------------------------------------------------

class VerifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    AtomicDirectory d(dir_);
    d.write_file("model.safetensors", std::string(5000, 'm'));
    d.write_file("optimizer.safetensors", std::string(3000, 'o'));
    d.write_file("state.json", std::string_view("{}"));
    d.commit();
    verify_directory(dir_);
  }
  TempDir tmp_;
  fs::path dir_ = tmp_ / "step_00000042";
};

TEST_F(VerifyTest, DetectsFlippedByte) {
  std::string bytes = read_bytes(dir_ / "model.safetensors");
  bytes[1234] ^= 0x01;
  write_bytes(dir_ / "model.safetensors", bytes);
  const std::string msg = error_of([&] { verify_directory(dir_); });
  EXPECT_HAS(msg, dir_.string());
  EXPECT_HAS(msg, "'model.safetensors' is corrupted");
  EXPECT_HAS(msg, "Do not use this checkpoint; resume from an older one");
}

TEST_F(VerifyTest, DetectsTruncatedFile) {
  fs::resize_file(dir_ / "optimizer.safetensors", 100);
  EXPECT_HAS(error_of([&] { verify_directory(dir_); }),
             "'optimizer.safetensors' is truncated: 100 bytes, expected 3000");
}

TEST_F(VerifyTest, DetectsMissingFileAndReportsAllProblems) {
  fs::remove(dir_ / "state.json");
  fs::resize_file(dir_ / "model.safetensors", 10);
  const std::string msg = error_of([&] { verify_directory(dir_); });
  EXPECT_HAS(msg, "'state.json' is missing");
  EXPECT_HAS(msg, "'model.safetensors' is truncated");
}

// A reader of some files (eval, sample and export read the weights alone) verifies those: the
// others may be missing or damaged, but its own are checked as before and must be listed.
TEST_F(VerifyTest, OnlyTheNamedFilesAreRequiredAndRead) {
  const std::vector<std::string> weights = {"state.json", "model.safetensors"};
  fs::remove(dir_ / "optimizer.safetensors");
  EXPECT_EQ(verify_directory(dir_, weights).files.size(), 3u);
  EXPECT_HAS(error_of([&] { verify_directory(dir_); }), "'optimizer.safetensors' is missing");
  write_bytes(dir_ / "optimizer.safetensors", std::string(3000, 'x'));
  EXPECT_NO_THROW(verify_directory(dir_, weights));
  EXPECT_HAS(error_of([&] { verify_directory(dir_); }), "'optimizer.safetensors' is corrupted");
  fs::resize_file(dir_ / "model.safetensors", 10);
  EXPECT_HAS(error_of([&] { verify_directory(dir_, weights); }),
             "'model.safetensors' is truncated");
  const std::vector<std::string> unlisted = {"state.json", "weights.bin"};
  EXPECT_HAS(error_of([&] { verify_directory(dir_, unlisted); }),
             "'weights.bin' is not listed in its manifest");
  write_bytes(dir_ / "stray.txt", "x");  // unlisted files are refused whatever is read
  EXPECT_HAS(error_of([&] { verify_directory(dir_, std::vector<std::string>{"state.json"}); }),
             "'stray.txt' is not listed");
}

TEST_F(VerifyTest, DetectsMissingOrCorruptManifest) {
  write_bytes(dir_ / "MANIFEST.json", "{\"files\": [");
  EXPECT_HAS(error_of([&] { verify_directory(dir_); }), "MANIFEST.json is corrupted");
  write_bytes(dir_ / "MANIFEST.json",  // version 1: written before manifests had a checksum
              R"({"version": 1, "files": [{"path": "../../etc/passwd", "size": 1,
                  "crc32c": "00000000"}]})");
  EXPECT_HAS(error_of([&] { verify_directory(dir_); }), "points outside");
  fs::remove(dir_ / "MANIFEST.json");
  const std::string msg = error_of([&] { verify_directory(dir_); });
  EXPECT_HAS(msg, "has no MANIFEST.json");
  EXPECT_HAS(msg, "incomplete");
  EXPECT_HAS(error_of([&] { verify_directory(tmp_ / "nothing"); }), "does not exist");
}

// Every single-bit change to MANIFEST.json that leaves it valid JSON is refused, naming it: the
// manifest's own checksum covers all of it (a changed size, checksum, path, version or digit of
// the self-checksum). Checked at every byte.
TEST_F(VerifyTest, RefusesAnyChangeToTheManifestItself) {
  const fs::path path = dir_ / "MANIFEST.json";
  const std::string text = read_bytes(path);
  ASSERT_NE(text.find("\"manifest_crc32c\""), std::string::npos);
  int still_json = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    for (const int bit : {0, 2}) {  // e.g. '1' <-> '0', '4' <-> '0', 'a' <-> 'e'
      std::string damaged = text;
      damaged[i] = static_cast<char>(damaged[i] ^ (1 << bit));
      if (!nlohmann::json::accept(damaged)) continue;
      ++still_json;
      write_bytes(path, damaged);
      EXPECT_HAS(error_of([&] { verify_directory(dir_); }), "MANIFEST.json is corrupted")
          << "byte " << i << " bit " << bit;
    }
  }
  EXPECT_GT(still_json, 100);  // the test ran over values, not only over the JSON's syntax
  write_bytes(path, text);
  EXPECT_NO_THROW(verify_directory(dir_));
}

// A manifest written before the self-checksum existed (version 1) is read as before; a version-2
// manifest without it (the key renamed by damage, or removed) is refused.
TEST_F(VerifyTest, OlderManifestsWithoutTheirOwnChecksumAreRead) {
  const fs::path path = dir_ / "MANIFEST.json";
  nlohmann::json doc = nlohmann::json::parse(read_bytes(path));
  ASSERT_EQ(doc["version"], 2);
  doc.erase("manifest_crc32c");
  write_bytes(path, doc.dump(2));
  EXPECT_HAS(error_of([&] { verify_directory(dir_); }), "its own checksum");
  doc["version"] = 1;
  write_bytes(path, doc.dump(2));
  EXPECT_NO_THROW(verify_directory(dir_));
  doc["files"][0]["size"] = 1;  // the files' checksums still protect them
  write_bytes(path, doc.dump(2));
  EXPECT_HAS(error_of([&] { verify_directory(dir_); }), "has the wrong size");
}

// ---- rotation -----------------------------------------------------------------------------------

void make_checkpoint(const fs::path& parent, std::uint64_t step) {
  AtomicDirectory d(parent / checkpoint_dir_name("step_", step));
  d.write_file("state.json", "{\"step\": " + std::to_string(step) + "}");
  d.commit();
}

// A save killed mid-write, as a process that dies with its AtomicDirectory open: the child
// builds one for `owner` and exits without unwinding. Returns the temporary directory.
fs::path killed_save(const fs::path& final_dir, const std::string& owner) {
  const fs::path before_marker = final_dir.parent_path() / ".marker";
  const pid_t child = ::fork();
  if (child == 0) {
    auto* d = new AtomicDirectory(final_dir, IfExists::kReplace, owner);  // never destroyed
    d->write_file("model.safetensors", std::string_view("half of it"));
    std::ofstream(before_marker) << d->temp_path().string();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  const std::string temp = read_bytes(before_marker);
  fs::remove(before_marker);
  return temp;
}

// The writer record lets a run remove what its own killed saves left, and nothing else: not
// another run's, not one without a record, not one whose writer still runs, and never a
// committed checkpoint (commit removes the record, so nothing of it is in the manifest).
TEST(AbandonedSaves, OnlyTheOwnersWithAGoneWriterAreRemoved) {
  TempDir tmp;
  const fs::path a1 = killed_save(tmp / "step_00000003", "run-a");
  const fs::path a2 = killed_save(tmp / "step_00000006", "run-a");
  const fs::path b = killed_save(tmp / "step_00000004", "run-b");
  const fs::path none = killed_save(tmp / "step_00000005", "");
  for (const fs::path& p : {a1, a2, b, none})
    ASSERT_TRUE(fs::is_directory(p)) << p;
  EXPECT_TRUE(fs::exists(a1 / ".writer.json"));
  EXPECT_FALSE(fs::exists(none / ".writer.json"));
  AtomicDirectory alive(tmp / "step_00000007", IfExists::kFail, "run-a");  // being written now
  make_checkpoint(tmp.path(), 2);

  AbandonedSaves r = remove_abandoned_saves(tmp.path(), "run-a");
  std::sort(r.removed.begin(), r.removed.end());
  EXPECT_EQ(r.removed, (std::vector<fs::path>{a1, a2}));
  ASSERT_EQ(r.kept.size(), 1u);
  EXPECT_HAS(r.kept[0], alive.temp_path().string());
  EXPECT_HAS(r.kept[0], "written by this process");
  for (const fs::path& p : {b, none, alive.temp_path()})
    EXPECT_TRUE(fs::is_directory(p)) << p;
  EXPECT_TRUE(remove_abandoned_saves(tmp.path(), "run-c").removed.empty());
  EXPECT_TRUE(remove_abandoned_saves(tmp.path(), "").removed.empty());

  alive.write_file("state.json", std::string_view("{}"));
  alive.commit();
  EXPECT_EQ(verify_directory(tmp / "step_00000007").files.size(), 1u);
  EXPECT_FALSE(fs::exists(tmp / "step_00000007" / ".writer.json"));
  verify_directory(tmp / "step_00000002");
}

// The record's process identity: a pid now used by a process started later (or by nobody), or
// another boot, is gone; a process on another host cannot be seen and is kept. From another PID
// namespace (a container sharing the volume, host name and boot; or the same container
// restarted) the pid means nothing: the directory's lock tells, held while its writer lives. A
// record written before the namespace was recorded is read as this namespace's.
TEST(AbandonedSaves, APidReusedOrAnotherBootIsGoneAnotherHostIsKept) {
  TempDir tmp;
  const fs::path dir = killed_save(tmp / "step_00000001", "run-a");
  const auto record = nlohmann::json::parse(read_bytes(dir / ".writer.json"));
  const auto with = [&](const char* key, const nlohmann::json& value) {
    nlohmann::json j = record;
    j[key] = value;
    const fs::path d = tmp / (".step_00000001.tmp-" + std::string(key));
    fs::create_directories(d);
    write_bytes(d / ".writer.json", j.dump());
    return d;
  };
  const fs::path reused = with("pid", ::getppid());  // alive, but started before the writer
  const fs::path rebooted = with("boot_id", "another boot");
  const fs::path elsewhere = with("host", "another-host");
  const fs::path restarted = tmp / ".step_00000001.tmp-restarted";
  fs::rename(with("pid_ns", "pid:[1]"), restarted);  // lock free: its writer is gone
  const fs::path contained = tmp / ".step_00000001.tmp-contained";
  fs::rename(with("pid_ns", "pid:[2]"), contained);
  const int lock = ::open(contained.c_str(), O_RDONLY | O_DIRECTORY);  // as its live writer's
  ASSERT_GE(lock, 0);
  ASSERT_EQ(::flock(lock, LOCK_EX | LOCK_NB), 0);
  ASSERT_TRUE(record.contains("pid_ns"));
  nlohmann::json old = record;
  old.erase("pid_ns");
  const fs::path older = tmp / ".step_00000001.tmp-older";
  fs::create_directories(older);
  write_bytes(older / ".writer.json", old.dump());
  AbandonedSaves r = remove_abandoned_saves(tmp.path(), "run-a");
  std::sort(r.removed.begin(), r.removed.end());
  std::sort(r.kept.begin(), r.kept.end());
  ::close(lock);
  std::vector<fs::path> gone = {dir, reused, rebooted, older, restarted};
  std::sort(gone.begin(), gone.end());
  EXPECT_EQ(r.removed, gone);
  ASSERT_EQ(r.kept.size(), 2u);
  EXPECT_HAS(r.kept[0] + r.kept[1], "written from host 'another-host'");
  EXPECT_HAS(r.kept[0] + r.kept[1],
             "written from PID namespace 'pid:[2]' (another container?): its writer still holds "
             "its lock");
  EXPECT_TRUE(fs::is_directory(elsewhere));
  EXPECT_TRUE(fs::is_directory(contained));
  // A live AtomicDirectory holds that lock: seen from another namespace, it is kept.
  AtomicDirectory live(tmp / "step_00000009", IfExists::kFail, "run-a");
  nlohmann::json j = nlohmann::json::parse(read_bytes(live.temp_path() / ".writer.json"));
  j["pid_ns"] = "pid:[3]";
  write_bytes(live.temp_path() / ".writer.json", j.dump());
  r = remove_abandoned_saves(tmp.path(), "run-a");
  EXPECT_EQ(r.removed, std::vector<fs::path>{contained});  // its lock was let go above
  EXPECT_TRUE(fs::is_directory(live.temp_path()));
}

TEST(Rotation, NamesSortNumerically) {
  EXPECT_EQ(checkpoint_dir_name("step_", 1000), "step_00001000");
  EXPECT_EQ(checkpoint_dir_name("step_", 0), "step_00000000");
  EXPECT_EQ(checkpoint_dir_name("step_", 123456789), "step_123456789");
  TempDir tmp;
  make_checkpoint(tmp.path(), 99999999);
  make_checkpoint(tmp.path(), 100000000);  // 9 digits: sorts after by number, not by name
  EXPECT_EQ(latest_checkpoint(tmp.path(), "step_"), tmp / "step_100000000");
}

TEST(Rotation, KeepsNewestAndIgnoresTempAndIncomplete) {
  TempDir tmp;
  for (std::uint64_t s : {300, 100, 2500, 1000, 200})
    make_checkpoint(tmp.path(), s);
  fs::create_directory(tmp / "step_00003000");  // incomplete: no manifest
  write_bytes(tmp / "step_00003000/state.json", "{}");
  fs::create_directory(tmp / ".step_00004000.tmp-123-abcdef01");  // a write in progress
  fs::create_directory(tmp / "step_abc");
  fs::create_directory(tmp / "notes");
  write_bytes(tmp / "step_00005000", "a file, not a directory");

  EXPECT_EQ(latest_checkpoint(tmp.path(), "step_"), tmp / "step_00002500");
  const auto listed = list_checkpoints(tmp.path(), "step_");
  ASSERT_EQ(listed.size(), 5u);
  EXPECT_EQ(listed.front().step, 100u);
  EXPECT_EQ(listed.back().step, 2500u);
  // Named like checkpoints, not complete ones: what a save at their step would have to replace.
  const auto odd = list_incomplete(tmp.path(), "step_");
  ASSERT_EQ(odd.size(), 2u);
  EXPECT_EQ(odd[0].path, tmp / "step_00003000");
  EXPECT_EQ(odd[1].path, tmp / "step_00005000");
  EXPECT_EQ(odd[1].step, 5000u);
  // The checkpoint holding a path, itself included; none for the folder of checkpoints.
  EXPECT_EQ(enclosing_checkpoint(tmp / "step_00000300"), fs::canonical(tmp / "step_00000300"));
  EXPECT_EQ(enclosing_checkpoint(tmp / "step_00000300/a/b"), fs::canonical(tmp / "step_00000300"));
  EXPECT_EQ(enclosing_checkpoint(tmp.path()), fs::path());
  EXPECT_EQ(enclosing_checkpoint(tmp / "step_00003000"), fs::path());

  EXPECT_TRUE(rotate_checkpoints(tmp.path(), "step_", 0).empty());  // 0 = keep all
  const auto deleted = rotate_checkpoints(tmp.path(), "step_", 2);
  EXPECT_EQ(deleted, (std::vector<fs::path>{tmp / "step_00000100", tmp / "step_00000200",
                                            tmp / "step_00000300"}));
  EXPECT_EQ(
      dir_entries(tmp.path()),
      (std::vector<std::string>{".step_00004000.tmp-123-abcdef01", "notes", "step_00001000",
                                "step_00002500", "step_00003000", "step_00005000", "step_abc"}));
  EXPECT_TRUE(rotate_checkpoints(tmp.path(), "step_", 2).empty());
  EXPECT_EQ(list_temporary_dirs(tmp.path()),
            std::vector<fs::path>{tmp / ".step_00004000.tmp-123-abcdef01"});
  verify_directory(tmp / "step_00001000");
  verify_directory(tmp / "step_00002500");
}

TEST(Rotation, LatestSkipsIncompleteAndHandlesMissingParent) {
  TempDir tmp;
  EXPECT_EQ(latest_checkpoint(tmp / "absent", "step_"), std::nullopt);
  EXPECT_EQ(latest_checkpoint(tmp.path(), "step_"), std::nullopt);
  make_checkpoint(tmp.path(), 10);
  fs::create_directory(tmp / "step_00000020");  // crashed before the manifest
  EXPECT_EQ(latest_checkpoint(tmp.path(), "step_"), tmp / "step_00000010");
  write_bytes(tmp / "file", "x");
  EXPECT_HAS(error_of([&] { (void)latest_checkpoint(tmp / "file", "step_"); }),
             "is not a directory");
}

}  // namespace
