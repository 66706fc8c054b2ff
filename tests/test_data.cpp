// Tests for src/data: shard format and validation, path discovery, text and synthetic sources,
// the shuffling DataLoader (determinism, epochs, resume, ranks, validation split).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "data/loader.h"
#include "data/shard.h"
#include "data/shuffle.h"
#include "data/synthetic.h"
#include "data/token_source.h"

namespace zo::data {
namespace {

namespace fs = std::filesystem;

// A unique temporary directory, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("zo_test_data_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(counter++) + "_" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void put_i32(std::vector<unsigned char>& b, size_t at, int32_t v) {
  for (int i = 0; i < 4; ++i)
    b[at + i] = static_cast<unsigned char>(static_cast<uint32_t>(v) >> (8 * i));
}

// A raw shard image: header fields as given, then `body_tokens` tokens 0, 1, 2, ...
std::vector<unsigned char> shard_bytes(int32_t magic, int32_t version, int32_t count,
                                       size_t body_tokens) {
  std::vector<unsigned char> b(1024 + 2 * body_tokens, 0);
  put_i32(b, 0, magic);
  put_i32(b, 4, version);
  put_i32(b, 8, count);
  for (size_t i = 0; i < body_tokens; ++i) {
    b[1024 + 2 * i] = static_cast<unsigned char>(i & 0xff);
    b[1024 + 2 * i + 1] = static_cast<unsigned char>((i >> 8) & 0xff);
  }
  return b;
}

// Tokens first, first+1, ... (mod 2^16): a token's value tells where it came from.
std::vector<uint16_t> ramp(size_t n, uint32_t first = 0) {
  std::vector<uint16_t> t(n);
  for (size_t i = 0; i < n; ++i)
    t[i] = static_cast<uint16_t>(first + i);
  return t;
}

std::shared_ptr<const TokenSource> open_path(const std::string& path, int64_t vocab = 65536,
                                             DataFormat format = DataFormat::kAuto,
                                             bool scan = true) {
  SourceConfig c;
  c.path = path;
  c.vocab_size = vocab;
  c.format = format;
  c.scan_tokens = scan;
  return open_token_source(c);
}

// Runs f, expects a DataError whose message contains every string in `parts`.
template <typename F>
void expect_data_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected a DataError containing '" << parts.front() << "'";
  } catch (const DataError& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) {
      EXPECT_NE(msg.find(p), std::string::npos) << "message lacks '" << p << "': " << msg;
    }
  }
}

std::vector<std::string> names(const TokenSource& s) {
  std::vector<std::string> out;
  for (size_t d = 0; d < s.num_documents(); ++d) {
    out.push_back(fs::path(s.document_name(d)).filename().string());
  }
  return out;
}

using Batch = std::pair<std::vector<int32_t>, std::vector<int32_t>>;

std::vector<Batch> take(DataLoader& loader, int n) {
  std::vector<Batch> out(static_cast<size_t>(n));
  for (auto& [x, y] : out)
    loader.next_batch(x, y);
  return out;
}

// Three shards of different lengths with globally unique token values (ramp offsets).
struct ThreeShards {
  TempDir dir;
  ThreeShards() {
    write_token_shard(dir.file("s0.bin"), ramp(5000, 0));
    write_token_shard(dir.file("s1.bin"), ramp(3000, 10000));
    write_token_shard(dir.file("s2.bin"), ramp(4200, 20000));
  }
};

LoaderConfig small_config(int64_t B = 4, int64_t T = 16, uint64_t seed = 1) {
  LoaderConfig c;
  c.batch_size = B;
  c.seq_len = T;
  c.seed = seed;
  c.val_fraction = 0.0;
  return c;
}

// ---- shard format --------------------------------------------------------------------------

TEST(Shard, RoundTrip) {
  TempDir dir;
  const std::string path = dir.file("round.bin");
  std::vector<uint16_t> tokens(12345);
  std::mt19937 rng(3);
  for (auto& t : tokens)
    t = static_cast<uint16_t>(rng());
  write_token_shard(path, tokens);

  EXPECT_EQ(fs::file_size(path), 1024 + 2 * tokens.size());
  EXPECT_TRUE(has_shard_magic(path));
  EXPECT_EQ(validate_shard(path).num_tokens, tokens.size());
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  auto src = open_path(path);
  ASSERT_EQ(src->num_documents(), 1u);
  EXPECT_EQ(src->document_tokens(0), tokens.size());
  std::vector<int32_t> all(tokens.size());
  src->read(0, 0, all);
  for (size_t i = 0; i < tokens.size(); ++i)
    ASSERT_EQ(all[i], tokens[i]) << i;
  std::vector<int32_t> mid(100);
  src->read(0, 5000, mid);
  EXPECT_EQ(mid[0], tokens[5000]);
  EXPECT_EQ(mid[99], tokens[5099]);
  std::vector<int32_t> past(2);
  EXPECT_THROW(src->read(0, tokens.size() - 1, past), DataError);
}

// llm.c's Llama 3 shards: magic 20240801, version 7, uint32 tokens.
TEST(Shard, Uint32RoundTripAndMixedWithUint16) {
  TempDir dir;
  std::vector<uint32_t> tokens(7777);
  std::mt19937 rng(5);
  for (auto& t : tokens)
    t = std::uint32_t(rng() % 128256);  // Llama 3's vocabulary: most tokens above 65535
  const std::string path = dir.file("llama.bin");
  write_token_shard(path, tokens);
  EXPECT_EQ(fs::file_size(path), 1024 + 4 * tokens.size());
  std::vector<unsigned char> head(12);
  std::ifstream(path, std::ios::binary).read(reinterpret_cast<char*>(head.data()), 12);
  EXPECT_EQ(head[0] | head[1] << 8 | head[2] << 16 | head[3] << 24, 20240801);
  EXPECT_EQ(head[4] | head[5] << 8 | head[6] << 16 | head[7] << 24, 7);
  EXPECT_TRUE(has_shard_magic(path));
  const ShardInfo info = validate_shard(path);
  EXPECT_EQ(info.num_tokens, tokens.size());
  EXPECT_EQ(info.token_bytes, 4);
  // With a uint16 shard beside it: each decodes by its own header.
  write_token_shard(dir.file("small.bin"), ramp(3000, 100));
  auto src = open_path(dir.str(), 128256);
  ASSERT_EQ(names(*src), (std::vector<std::string>{"llama.bin", "small.bin"}));
  std::vector<int32_t> all(tokens.size());
  src->read(0, 0, all);
  for (size_t i = 0; i < tokens.size(); ++i)
    ASSERT_EQ(all[i], static_cast<int32_t>(tokens[i])) << i;
  std::vector<int32_t> mid(5);
  src->read(0, 6000, mid);
  EXPECT_EQ(mid[4], static_cast<int32_t>(tokens[6004]));
  src->read(1, 10, mid);
  EXPECT_EQ(mid[0], 110);
  EXPECT_EQ(src->fingerprint()["kind"], "shards");
}

TEST(Shard, WriterRejectsEmpty) {
  TempDir dir;
  expect_data_error([&] { write_token_shard(dir.file("e.bin"), std::vector<uint16_t>{}); },
                    {"e.bin", "no tokens"});
  expect_data_error([&] { write_token_shard(dir.file("e.bin"), std::vector<uint32_t>{}); },
                    {"e.bin", "no tokens"});
}

// ---- discovery -----------------------------------------------------------------------------

TEST(Discovery, DirectoryTakesBinFilesSortedByName) {
  TempDir dir;
  write_token_shard(dir.file("c.bin"), ramp(10));
  write_token_shard(dir.file("a.bin"), ramp(10));
  write_token_shard(dir.file("b.bin"), ramp(10));
  write_token_shard(dir.file(".hidden.bin"), ramp(10));
  write_bytes(dir.file("notes.txt"), {'h', 'i'});
  fs::create_directory(dir.file("sub.bin"));
  auto src = open_path(dir.str());
  EXPECT_EQ(names(*src), (std::vector<std::string>{"a.bin", "b.bin", "c.bin"}));
  EXPECT_EQ(src->total_tokens(), 30u);
}

TEST(Discovery, GlobMatchesSortedByteOrder) {
  TempDir dir;
  for (const char* n : {"s_10.bin", "s_2.bin", "s_1.bin", "x_1.bin"}) {
    write_token_shard(dir.file(n), ramp(10));
  }
  auto src = open_path(dir.file("s_*.bin"));
  EXPECT_EQ(names(*src), (std::vector<std::string>{"s_1.bin", "s_10.bin", "s_2.bin"}));
  const auto files = expand_data_path(dir.file("*_1.bin"), DataFormat::kAuto);
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(fs::path(files[0]).filename(), "s_1.bin");
  EXPECT_EQ(fs::path(files[1]).filename(), "x_1.bin");
}

TEST(Discovery, MissingPathsAndEmptySetsAreClearErrors) {
  TempDir dir;
  expect_data_error([&] { open_path(dir.file("nope.bin")); }, {"nope.bin", "does not exist"});
  expect_data_error([&] { open_path(dir.file("*.bin")); }, {"*.bin", "matches no files"});
  expect_data_error([&] { open_path(dir.str()); }, {dir.str(), "no *.bin"});
  write_bytes(dir.file("a.txt"), {'x'});
  expect_data_error([&] { open_path(dir.str()); }, {"--data-format text"});
  expect_data_error([&] { open_path(""); }, {"--data"});
  expect_data_error([&] { parse_data_format("csv"); }, {"csv", "auto, shards, text, synthetic"});
  EXPECT_EQ(parse_data_format("text"), DataFormat::kText);
}

TEST(Discovery, UnreadableFileIsAClearError) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files regardless of permissions";
  TempDir dir;
  const std::string path = dir.file("locked.bin");
  write_token_shard(path, ramp(100));
  ::chmod(path.c_str(), 0);
  expect_data_error([&] { open_path(path); }, {"locked.bin", "permission denied"});
}

TEST(Discovery, NonRegularFileIsAClearError) {
  TempDir dir;
  const std::string fifo = dir.file("pipe.bin");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_data_error([&] { open_path(fifo); }, {"pipe.bin", "not a regular file"});
}

TEST(Discovery, MixedShardsAndTextAreRejected) {
  TempDir dir;
  write_token_shard(dir.file("a.bin"), ramp(100));
  write_bytes(dir.file("b.txt"), {'h', 'i'});
  expect_data_error([&] { open_path(dir.file("*")); }, {"mixes token shards", "a.bin", "b.txt"});
}

TEST(Discovery, ConcurrentReadsAcrossMoreFilesThanTheDescriptorCache) {
  TempDir dir;
  const int files = 80;  // > the source's 64 cached descriptors: reads evict each other
  for (int f = 0; f < files; ++f) {
    char name[32];
    std::snprintf(name, sizeof name, "s%03d.bin", f);
    write_token_shard(dir.file(name), ramp(300, static_cast<uint32_t>(f * 300)));
  }
  auto src = open_path(dir.str());
  ASSERT_EQ(src->num_documents(), static_cast<size_t>(files));
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<int32_t> buf(17);
      for (int i = 0; i < 2000; ++i) {
        const size_t doc = static_cast<size_t>((i * 7 + t * 13) % files);
        const uint64_t off = static_cast<uint64_t>((i * 31) % 280);
        try {
          src->read(doc, off, buf);
        } catch (const DataError&) {
          ++bad;
          continue;
        }
        if (buf[0] != static_cast<int32_t>(doc * 300 + off) || buf[16] != buf[0] + 16) ++bad;
      }
    });
  }
  for (auto& th : threads)
    th.join();
  EXPECT_EQ(bad.load(), 0);
}

// ---- bad shards: every case names the file ------------------------------------------------

TEST(BadShard, EachDefectIsADataErrorNamingTheFile) {
  TempDir dir;
  struct Case {
    const char* name;
    std::vector<unsigned char> bytes;
    const char* expect;
  };
  std::vector<unsigned char> short_header(100, 0);
  put_i32(short_header, 0, kShardMagic);
  const std::vector<Case> cases = {
      {"wrong_magic.bin", shard_bytes(12345, 1, 100, 100), "magic is 12345, expected 20240520"},
      {"wrong_version.bin", shard_bytes(kShardMagic, 2, 100, 100), "version 2, expected 1"},
      {"truncated.bin", shard_bytes(kShardMagic, 1, 100, 60), "truncated"},
      {"short_header.bin", short_header, "truncated"},
      {"extra_bytes.bin", shard_bytes(kShardMagic, 1, 100, 101), "2 extra bytes"},
      {"count_mismatch.bin", shard_bytes(kShardMagic, 1, 50, 100), "promises 50 tokens"},
      {"zero_count.bin", shard_bytes(kShardMagic, 1, 0, 0), "empty"},
      {"zero_bytes.bin", {}, "empty"},
      // uint32 shards: the version must be 7, the size 1024 + 4 * count (body_tokens counts
      // 2-byte units here).
      {"u32_version.bin", shard_bytes(kShardMagicU32, 1, 100, 200), "version 1, expected 7"},
      {"u32_truncated.bin", shard_bytes(kShardMagicU32, 7, 100, 150), "truncated"},
      {"u32_extra.bin", shard_bytes(kShardMagicU32, 7, 100, 201), "2 extra bytes"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.file(c.name);
    write_bytes(path, c.bytes);
    expect_data_error([&] { validate_shard(path); }, {c.name, c.expect});
    expect_data_error([&] { open_path(path); }, {c.name, c.expect});
    fs::remove(path);
  }
  // An odd extra byte: the size cannot be 1024 + 2 * count.
  auto odd = shard_bytes(kShardMagic, 1, 100, 100);
  odd.push_back(7);
  write_bytes(dir.file("odd.bin"), odd);
  expect_data_error([&] { open_path(dir.file("odd.bin")); }, {"odd.bin", "1 extra bytes"});
}

TEST(BadShard, TokenAtOrAboveVocabIsFoundAtOpen) {
  TempDir dir;
  std::vector<uint16_t> tokens(3000, 7);
  tokens[2345] = 50257;
  const std::string path = dir.file("bigtok.bin");
  write_token_shard(path, tokens);
  expect_data_error([&] { open_path(path, 50257); },
                    {"bigtok.bin", "token 50257", "position 2345", "vocab_size is 50257"});
  EXPECT_NO_THROW(open_path(path, 50258));
}

TEST(BadShard, Uint32TokenAtOrAboveVocabIsFoundAtOpen) {
  TempDir dir;
  std::vector<uint32_t> tokens(3000, 7);
  tokens[1234] = 128256;
  const std::string path = dir.file("big32.bin");
  write_token_shard(path, tokens);
  expect_data_error([&] { open_path(path, 128256); },
                    {"big32.bin", "token 128256", "position 1234", "byte 5960"});
  EXPECT_NO_THROW(open_path(path, 128257));
  tokens[1234] = 0xffffffffu;  // would wrap negative as an int32
  write_token_shard(path, tokens);
  expect_data_error([&] { open_path(path, 1 << 24); }, {"big32.bin", "token 4294967295"});
}

TEST(BadShard, TokenAboveVocabWithoutScanIsCaughtByTheLoader) {
  TempDir dir;
  std::vector<uint16_t> tokens(40, 1);
  tokens[17] = 999;
  const std::string path = dir.file("lazy.bin");
  write_token_shard(path, tokens);
  auto src = open_path(path, 500, DataFormat::kAuto, /*scan=*/false);
  DataLoader loader(src, small_config(2, 16));
  std::vector<int32_t> x, y;
  expect_data_error([&] { loader.next_batch(x, y); },
                    {"lazy.bin", "token 999", "position 17", "vocab_size 500"});
}

// ---- text ----------------------------------------------------------------------------------

TEST(Text, FilesGiveByteTokens) {
  TempDir dir;
  const std::string text = "hello, world\n\xff\x01";
  write_bytes(dir.file("t.txt"), std::vector<unsigned char>(text.begin(), text.end()));
  auto src = open_path(dir.file("t.txt"), 256);
  ASSERT_EQ(src->document_tokens(0), text.size());
  std::vector<int32_t> tok(text.size());
  src->read(0, 0, tok);
  for (size_t i = 0; i < text.size(); ++i)
    EXPECT_EQ(tok[i], static_cast<unsigned char>(text[i]));
  EXPECT_EQ(src->fingerprint()["kind"], "text");

  expect_data_error([&] { open_path(dir.file("t.txt"), 100); }, {"vocab_size >= 256", "100"});
  write_bytes(dir.file("empty.txt"), {});
  expect_data_error([&] { open_path(dir.file("empty.txt"), 256); }, {"empty.txt", "empty"});
}

TEST(Text, FormatOverridesAndMagicSniffing) {
  TempDir dir;
  write_token_shard(dir.file("shard.dat"), ramp(50));
  auto sniffed = open_path(dir.file("shard.dat"));  // not *.bin, but starts with the magic
  EXPECT_EQ(sniffed->fingerprint()["kind"], "shards");
  EXPECT_EQ(sniffed->document_tokens(0), 50u);
  // Forced text: the same file becomes 1124 byte tokens.
  auto as_text = open_path(dir.file("shard.dat"), 256, DataFormat::kText);
  EXPECT_EQ(as_text->document_tokens(0), 1024u + 100u);
  // Forced shards: a text file is a wrong-magic error.
  write_bytes(dir.file("t.txt"), {'a', 'b'});
  expect_data_error([&] { open_path(dir.file("t.txt"), 256, DataFormat::kShards); },
                    {"t.txt", "truncated"});
}

// ---- synthetic task ------------------------------------------------------------------------

SyntheticConfig synth(uint64_t seed, int64_t vocab = 256) {
  SyntheticConfig c;
  c.seed = seed;
  c.vocab_size = vocab;
  return c;
}

TEST(Synthetic, DeterministicBySeedAndRandomAccess) {
  SyntheticTask a(synth(5)), b(synth(5)), c(synth(6));
  std::vector<int32_t> ta(20000), tb(20000), tc(20000);
  a.generate(0, ta);
  b.generate(0, tb);
  c.generate(0, tc);
  EXPECT_EQ(ta, tb);
  size_t same = 0;
  for (size_t i = 0; i < ta.size(); ++i)
    same += ta[i] == tc[i];
  EXPECT_LT(same, ta.size() / 10);  // unrelated streams agree ~1/256 of the time
  // Any slice read on its own equals the same slice of a long read (block boundaries included).
  for (uint64_t start : {0ull, 1ull, 4095ull, 4096ull, 9000ull, 12287ull}) {
    std::vector<int32_t> slice(3000);
    a.generate(start, slice);
    EXPECT_TRUE(std::equal(slice.begin(), slice.end(), ta.begin() + static_cast<long>(start)))
        << start;
  }
  // Every transition inside a block follows the chain.
  for (size_t i = 1; i < ta.size(); ++i) {
    if (i % a.config().block_len == 0) continue;
    const auto succ = a.successors(ta[i - 1]);
    ASSERT_NE(std::find(succ.begin(), succ.end(), ta[i]), succ.end()) << i;
  }
}

TEST(Synthetic, EmpiricalEntropyMatchesEntropyRate) {
  SyntheticTask task(synth(11));
  const size_t n = 1 << 20;
  std::vector<int32_t> tok(n);
  task.generate(0, tok);
  const size_t V = 256;
  std::vector<double> pair(V * V, 0.0), row(V, 0.0);
  double pairs = 0;
  for (size_t i = 1; i < n; ++i) {
    if (i % task.config().block_len == 0) continue;  // restarts are not chain transitions
    pair[tok[i - 1] * V + tok[i]] += 1;
    row[tok[i - 1]] += 1;
    pairs += 1;
  }
  double h = 0;  // plug-in conditional entropy H(X_t+1 | X_t)
  for (size_t a = 0; a < V; ++a) {
    for (size_t b = 0; b < V; ++b) {
      if (pair[a * V + b] > 0) h -= pair[a * V + b] / pairs * std::log(pair[a * V + b] / row[a]);
    }
  }
  const double H = task.entropy_rate();
  EXPECT_NEAR(h, H, 0.01 * H) << "empirical " << h << " vs exact " << H;
  EXPECT_GT(H, 0.5);
  EXPECT_LT(H, std::log(4.0));  // at most ln(branching)
  EXPECT_NEAR(task.uniform_loss(), std::log(256.0), 1e-12);
  EXPECT_GT(task.expected_loss(), H);
  EXPECT_LT(task.expected_loss(), H + 0.01);
  const auto& pi = task.stationary();
  EXPECT_NEAR(std::accumulate(pi.begin(), pi.end(), 0.0), 1.0, 1e-12);
  // Empirical token frequencies follow the stationary distribution.
  double tv = 0;
  for (size_t a = 0; a < V; ++a)
    tv += std::fabs(row[a] / pairs - pi[a]);
  EXPECT_LT(tv, 0.05);
}

TEST(Synthetic, SourceConfigAndErrors) {
  SourceConfig c;
  c.path = "synthetic";
  c.vocab_size = 512;
  c.synthetic.num_tokens = 100000;
  auto src = open_token_source(c);  // vocab 0 -> the model's 512
  EXPECT_EQ(src->vocab_size(), 512);
  EXPECT_EQ(src->fingerprint()["vocab_size"], 512);
  EXPECT_EQ(src->total_tokens(), 100000u);
  EXPECT_NE(src->describe().find("loss floor"), std::string::npos);
  c.synthetic.vocab_size = 1000;
  expect_data_error([&] { open_token_source(c); }, {"1000", "vocab_size is 512"});
  c.synthetic.vocab_size = 16;
  c.synthetic.branching = 17;
  expect_data_error([&] { open_token_source(c); }, {"branching 17"});
}

// ---- permutation ---------------------------------------------------------------------------

TEST(Permutation, IsABijectionThatDependsOnTheKey) {
  for (uint64_t n : {1ull, 2ull, 3ull, 7ull, 64ull, 1000ull, 4097ull}) {
    const Permutation p(n, 42), q(n, 43);
    std::vector<char> seen(n, 0);
    size_t moved = 0, differ = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t j = p(i);
      ASSERT_LT(j, n);
      ASSERT_FALSE(seen[j]) << "n=" << n << " i=" << i;
      seen[j] = 1;
      moved += j != i;
      differ += j != q(i);
    }
    if (n >= 64) {
      EXPECT_GT(moved, n * 9 / 10) << n;
      EXPECT_GT(differ, n * 9 / 10) << n;
    }
  }
}

// ---- loader --------------------------------------------------------------------------------

TEST(Loader, TargetsAreInputsShiftedByOne) {
  ThreeShards data;
  auto src = open_path(data.dir.str());
  DataLoader loader(src, small_config(4, 16));
  std::vector<int32_t> x, y;
  for (int step = 0; step < 20; ++step) {
    loader.next_batch(x, y);
    ASSERT_EQ(x.size(), 64u);
    ASSERT_EQ(y.size(), 64u);
    for (size_t r = 0; r < 4; ++r) {
      for (size_t t = 0; t < 16; ++t) {
        ASSERT_EQ(y[r * 16 + t], x[r * 16 + t] + 1);  // ramps: the next token is value + 1
        if (t + 1 < 16) {
          ASSERT_EQ(x[r * 16 + t + 1], y[r * 16 + t]);
        }
      }
      ASSERT_EQ((x[r * 16] % 10000) % 16, 0);  // windows start at multiples of T
    }
  }
}

TEST(Loader, SameSeedSameBatchesOtherSeedOtherOrder) {
  ThreeShards data;
  auto src = open_path(data.dir.str());
  DataLoader a(src, small_config(4, 16, 7)), b(src, small_config(4, 16, 7)),
      c(src, small_config(4, 16, 8));
  const auto ba = take(a, 30), bb = take(b, 30), bc = take(c, 30);
  EXPECT_EQ(ba, bb);
  EXPECT_NE(ba, bc);
  // A fresh source object over the same files gives the same batches too.
  DataLoader d(open_path(data.dir.str()), small_config(4, 16, 7));
  EXPECT_EQ(take(d, 30), ba);
}

TEST(Loader, EpochIsAPermutationOfAllWindowsAndTheNextReshuffles) {
  ThreeShards data;
  auto src = open_path(data.dir.str());
  // Windows: (5000-1)/16 + (3000-1)/16 + (4200-1)/16 = 312 + 187 + 262 = 761.
  DataLoader loader(src, small_config(1, 16, 3));
  ASSERT_EQ(loader.num_windows(), 761u);
  ASSERT_EQ(loader.batches_per_epoch(), 761u);
  std::vector<int32_t> x, y;
  std::vector<int32_t> first_epoch, second_epoch;
  for (uint64_t i = 0; i < 2 * loader.batches_per_epoch(); ++i) {
    EXPECT_EQ(loader.epoch(), i / 761);
    loader.next_batch(x, y);
    (i < 761 ? first_epoch : second_epoch).push_back(x[0]);
  }
  std::vector<int32_t> s1 = first_epoch, s2 = second_epoch;
  std::sort(s1.begin(), s1.end());
  std::sort(s2.begin(), s2.end());
  EXPECT_EQ(std::adjacent_find(s1.begin(), s1.end()), s1.end());  // no window twice
  EXPECT_EQ(s1, s2);                                              // same windows
  EXPECT_NE(first_epoch, second_epoch);                           // different order
  std::vector<int32_t> sorted_first = first_epoch;
  std::sort(sorted_first.begin(), sorted_first.end());
  EXPECT_NE(first_epoch, sorted_first);  // shuffled, not document order
  // The tail of an epoch that does not fill a batch is dropped, a different tail each epoch.
  DataLoader b5(src, small_config(5, 16, 3));
  EXPECT_EQ(b5.batches_per_epoch(), 152u);
}

TEST(Loader, ResumeFromStateGivesIdenticalBatches) {
  ThreeShards data;
  auto src = open_path(data.dir.str());
  const LoaderConfig cfg = small_config(8, 16, 21);
  DataLoader straight(src, cfg);
  const uint64_t per_epoch = straight.batches_per_epoch();  // 95
  // Checkpoint mid-epoch and again just before an epoch boundary.
  for (uint64_t stop : {uint64_t{13}, per_epoch - 2}) {
    SCOPED_TRACE(stop);
    straight.reset();
    take(straight, static_cast<int>(stop));
    const std::string saved = straight.state().dump();  // as it would sit in a checkpoint
    const auto expected = take(straight, 40);

    DataLoader resumed(open_path(data.dir.str()), cfg);
    resumed.restore(nlohmann::json::parse(saved));
    EXPECT_EQ(resumed.batches_served(), stop);
    EXPECT_EQ(take(resumed, 40), expected);
  }
  EXPECT_EQ(straight.state()["epoch"], 1);
}

TEST(Loader, RestoreRejectsOtherDataOrConfig) {
  ThreeShards data;
  auto src = open_path(data.dir.str());
  DataLoader loader(src, small_config(4, 16, 1));
  take(loader, 3);
  const nlohmann::json state = loader.state();

  DataLoader other_seq(src, small_config(4, 32, 1));
  expect_data_error([&] { other_seq.restore(state); }, {"seq_len: checkpoint 16, this run 32"});
  DataLoader other_seed(src, small_config(4, 16, 2));
  expect_data_error([&] { other_seed.restore(state); }, {"seed"});

  // Same file names and sizes, different content.
  TempDir other;
  write_token_shard(other.file("s0.bin"), ramp(5000, 1));
  write_token_shard(other.file("s1.bin"), ramp(3000, 10000));
  write_token_shard(other.file("s2.bin"), ramp(4200, 20000));
  DataLoader changed(open_path(other.str()), small_config(4, 16, 1));
  expect_data_error([&] { changed.restore(state); }, {"data file #0", "s0.bin", "hash"});
  // One shard fewer.
  DataLoader fewer(open_path(data.dir.file("s[01].bin")), small_config(4, 16, 1));
  expect_data_error([&] { fewer.restore(state); }, {"checkpoint has 3, this run 2"});
  // Other kind of data.
  SourceConfig sc;
  sc.path = "synthetic";
  sc.vocab_size = 256;
  DataLoader synthetic(open_token_source(sc), small_config(4, 16, 1));
  expect_data_error([&] { synthetic.restore(state); }, {"data kind"});
  // Damaged state.
  expect_data_error([&] { loader.restore(nlohmann::json{{"x", 1}}); }, {"not a data loader state"});
  nlohmann::json broken = state;
  broken["batches_served"] = "many";
  expect_data_error([&] { loader.restore(broken); }, {"malformed"});
  for (const nlohmann::json& v :
       {nlohmann::json(-1), nlohmann::json(1.5), nlohmann::json(uint64_t{1} << 60)}) {
    broken = state;
    broken["batches_served"] = v;  // -1 used to wrap to 2^64 - 1, 1.5 to truncate to 1
    expect_data_error([&] { loader.restore(broken); },
                      {"batches_served = " + v.dump() + " is not an integer in [0, "});
  }
  broken = state;
  broken["epoch"] = 7;
  expect_data_error([&] { loader.restore(broken); },
                    {"epoch = 7 does not follow from batches_served 3"});
  broken = state;
  broken["config"]["world_size"] = -2;
  expect_data_error([&] { loader.restore(broken); }, {"world_size = -2 is not an integer"});
  broken = state;
  broken["config"]["batch_size"] = int64_t{1} << 40;  // times the ranks would overflow
  expect_data_error([&] { loader.restore(broken); }, {"batch_size = 1099511627776"});
  // A file entry without its token count, read when the entries differ.
  broken = state;
  broken["data"]["files"][0].erase("tokens");
  expect_data_error([&] { loader.restore(broken); }, {"data file #0", "(? tokens"});
  EXPECT_EQ(loader.batches_served(), 3u);  // a failed restore changes nothing
}

TEST(Loader, RanksSplitTheGlobalOrder) {
  ThreeShards data;
  auto src = open_path(data.dir.str());
  const int W = 3;
  const int64_t B = 4;
  DataLoader single(src, small_config(B * W, 16, 9));
  std::vector<std::unique_ptr<DataLoader>> ranks;
  for (int r = 0; r < W; ++r) {
    LoaderConfig c = small_config(B, 16, 9);
    c.rank = r;
    c.world_size = W;
    ranks.push_back(std::make_unique<DataLoader>(src, c));
    EXPECT_EQ(ranks.back()->batches_per_epoch(), single.batches_per_epoch());
  }
  const int steps = static_cast<int>(single.batches_per_epoch()) + 5;  // across an epoch end
  std::vector<int32_t> x, y, rx, ry;
  for (int s = 0; s < steps; ++s) {
    single.next_batch(x, y);
    std::multiset<std::vector<int32_t>> single_rows, rank_rows;
    for (int64_t i = 0; i < B * W; ++i) {
      single_rows.insert(std::vector<int32_t>(x.begin() + i * 16, x.begin() + (i + 1) * 16));
    }
    for (int r = 0; r < W; ++r) {
      ranks[r]->next_batch(rx, ry);
      for (int64_t i = 0; i < B; ++i) {
        // Rank r's row i is global row i * W + r.
        ASSERT_TRUE(std::equal(rx.begin() + i * 16, rx.begin() + (i + 1) * 16,
                               x.begin() + (i * W + r) * 16));
        rank_rows.insert(std::vector<int32_t>(rx.begin() + i * 16, rx.begin() + (i + 1) * 16));
      }
    }
    ASSERT_EQ(single_rows, rank_rows) << "step " << s;
  }
  LoaderConfig bad = small_config(B, 16, 9);
  bad.rank = 3;
  bad.world_size = 3;
  expect_data_error([&] { DataLoader{src, bad}; }, {"rank 3"});
}

TEST(Loader, ValidationIsTheDisjointTailOfEachDocument) {
  ThreeShards data;
  auto src = open_path(data.dir.str());
  LoaderConfig cfg = small_config(2, 16, 4);
  cfg.val_fraction = 0.1;
  Loaders loaders = make_loaders(src, nullptr, cfg);
  ASSERT_TRUE(loaders.train && loaders.val);
  DataLoader& train = *loaders.train;
  DataLoader& val = *loaders.val;

  // Token ranges [offset, offset + T] touched by each split.
  auto ranges = [](const DataLoader& l) {
    std::vector<std::tuple<size_t, uint64_t, uint64_t>> out;
    for (uint64_t w = 0; w < l.num_windows(); ++w) {
      const WindowRef r = l.locate(w);
      out.emplace_back(r.doc, r.offset, r.offset + 16);
    }
    return out;
  };
  const auto tr = ranges(train), va = ranges(val);
  EXPECT_GT(va.size(), 0u);
  for (const auto& [vd, vb, ve] : va) {
    for (const auto& [td, tb, te] : tr) {
      if (vd == td) {
        ASSERT_TRUE(ve < tb || te < vb) << "overlap in doc " << vd;
      }
    }
  }
  // The held-out tail is floor(0.1 * n) tokens: s0 holds out 500, val windows (500-1)/16 = 31.
  EXPECT_EQ(val.locate(0).doc, 0u);
  EXPECT_EQ(val.locate(0).offset, 4500u);
  EXPECT_EQ(val.num_windows(), 31u + 18u + 26u);
  EXPECT_EQ(train.num_windows(), (4499u / 16) + (2699u / 16) + (3779u / 16));

  // Val: sequential in document order, the same pass again after reset().
  std::vector<int32_t> x, y;
  val.next_batch(x, y);
  EXPECT_EQ(x[0], 4500);
  EXPECT_EQ(x[16], 4516);
  const auto pass = take(val, 5);
  val.reset();
  take(val, 1);
  EXPECT_EQ(take(val, 5), pass);
  // Served train batches never contain a val token (tokens are unique across the data set).
  std::set<int32_t> val_tokens;
  val.reset();
  for (uint64_t b = 0; b < val.batches_per_epoch(); ++b) {
    val.next_batch(x, y);
    val_tokens.insert(x.begin(), x.end());
    val_tokens.insert(y.begin(), y.end());
  }
  for (uint64_t b = 0; b < train.batches_per_epoch(); ++b) {
    train.next_batch(x, y);
    for (int32_t t : y)
      ASSERT_EQ(val_tokens.count(t), 0u) << t;
  }
}

TEST(Loader, SeparateValidationSourceAndSyntheticStream) {
  ThreeShards data;
  TempDir vdir;
  write_token_shard(vdir.file("val.bin"), ramp(1000, 40000));
  LoaderConfig cfg = small_config(2, 16, 4);
  cfg.val_fraction = 0.05;  // ignored with a val source
  Loaders l = make_loaders(open_path(data.dir.str()), open_path(vdir.file("val.bin")), cfg);
  EXPECT_EQ(l.train->num_windows(), 761u);  // all of the train data
  EXPECT_EQ(l.val->num_windows(), 999u / 16);
  std::vector<int32_t> x, y;
  l.val->next_batch(x, y);
  EXPECT_EQ(x[0], 40000);
  cfg.val_fraction = 0;
  EXPECT_EQ(make_loaders(open_path(data.dir.str()), nullptr, cfg).val, nullptr);

  // The synthetic stream through the loader: deterministic, in range, val from its tail.
  SourceConfig sc;
  sc.path = "synthetic";
  sc.vocab_size = 256;
  sc.synthetic.num_tokens = 1 << 16;
  cfg.val_fraction = 0.05;
  Loaders s1 = make_loaders(open_token_source(sc), nullptr, cfg);
  Loaders s2 = make_loaders(open_token_source(sc), nullptr, cfg);
  EXPECT_EQ(take(*s1.train, 10), take(*s2.train, 10));
  s1.val->next_batch(x, y);
  EXPECT_EQ(s1.val->locate(0).offset, (1u << 16) - 3276u);
  for (int32_t t : x)
    EXPECT_LT(t, 256);
}

TEST(Loader, TooLittleDataIsAClearError) {
  TempDir dir;
  write_token_shard(dir.file("big.bin"), ramp(1000));
  write_token_shard(dir.file("tiny.bin"), ramp(10));
  expect_data_error(
      [&] {
        DataLoader{open_path(dir.str()), small_config(1, 16)};
      },
      {"tiny.bin", "10 tokens", "seq_len + 1 = 17"});
  fs::remove(dir.file("tiny.bin"));
  auto src = open_path(dir.str());
  // 999/16 = 62 windows: 62 rows fit one batch, 63 do not.
  EXPECT_NO_THROW((DataLoader{src, small_config(62, 16)}));
  expect_data_error(
      [&] {
        DataLoader{src, small_config(63, 16)};
      },
      {"62 windows", "fewer than one batch", "--micro-batch"});
  LoaderConfig v = small_config(8, 16);
  v.val_fraction = 0.01;  // holds out 10 tokens: no val window
  v.split = Split::kVal;
  expect_data_error([&] { DataLoader{src, v}; }, {"val split has 0 windows", "--val-fraction"});
  LoaderConfig all_val = small_config(8, 16);
  all_val.val_fraction = 1.0;
  expect_data_error([&] { DataLoader{src, all_val}; }, {"no training data"});
}

}  // namespace
}  // namespace zo::data
