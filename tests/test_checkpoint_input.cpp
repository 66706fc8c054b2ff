// Hostile input to the checkpoint module's readers: JSON nested beyond the limit or with repeated
// keys (safetensors headers, MANIFEST.json), FIFOs and other non-regular files, files a checkpoint
// directory holds that its manifest does not list.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "checkpoint/atomic_io.h"
#include "checkpoint/json_input.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "input_test.h"

namespace {

namespace fs = std::filesystem;
using zo::CheckpointError;
using zo::ckpt::JsonError;
using zo::ckpt::parse_json;
using zo::test::error_of;
using zo::test::Scratch;

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << s;
}

// `levels` nested arrays around 0: deep enough at 10^6 to overflow the stack of a recursive
// dump() or operator==, which is what a bounded parse prevents.
std::string nested(std::size_t levels) {
  return std::string(levels, '[') + "0" + std::string(levels, ']');
}

// A safetensors file: 8-byte little-endian header length, the header, the data.
std::string safetensors(const std::string& header, const std::string& data) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i)
    s[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  return s + header + data;
}

TEST(JsonInput, DepthIsBoundedAtTheNamedLimit) {
  EXPECT_EQ(parse_json(nested(zo::ckpt::kMaxJsonDepth)).dump().size(),
            2 * std::size_t(zo::ckpt::kMaxJsonDepth) + 1);
  for (std::size_t levels : {std::size_t(zo::ckpt::kMaxJsonDepth) + 1, std::size_t(1) << 20}) {
    EXPECT_HAS(error_of([&] { parse_json(nested(levels)); }), "deeper than 64 levels");
  }
  EXPECT_HAS(error_of([&] { parse_json("{\"a\": " + nested(100000) + "}"); }), "64 levels");
}

TEST(JsonInput, RepeatedKeysAreRefusedAtAnyDepth) {
  EXPECT_HAS(error_of([] { parse_json(R"({"a": 1, "b": 2, "a": 1})"); }),
             "key \"a\" appears twice");
  EXPECT_HAS(error_of([] { parse_json(R"({"x": [{"k": 1, "k": 2}]})"); }), "key \"k\" appears");
  // The same key in different objects is fine.
  EXPECT_NO_THROW(parse_json(R"({"a": {"a": 1}, "b": [{"a": 1}, {"a": 2}]})"));
}

TEST(JsonInput, SyntaxErrorsAndNumberOverflowAreJsonErrors) {
  EXPECT_THROW(parse_json("{\"a\": "), JsonError);
  EXPECT_THROW(parse_json("[1e400]"), JsonError);
  EXPECT_THROW(parse_json(""), JsonError);
}

TEST(SafetensorsInput, DeepOrRepeatedHeaderKeysAreRefused) {
  Scratch d;
  // A shape nested a million levels deep: the old reader printed it in its error message.
  write_text(d.path / "deep.safetensors",
             safetensors(R"({"t": {"dtype": "F32", "shape": )" + nested(1 << 20) +
                             R"(, "data_offsets": [0, 4]}})",
                         "abcd"));
  std::string e =
      error_of([&] { (void)zo::ckpt::SafetensorsFile::open(d.path / "deep.safetensors"); });
  EXPECT_HAS(e, "deep.safetensors");
  EXPECT_HAS(e, "deeper than 64 levels");
  // The same tensor twice: which one would be read?
  const std::string t = R"({"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})";
  write_text(d.path / "twice.safetensors",
             safetensors("{\"t\": " + t + ", \"t\": " + t + "}", "abcd"));
  e = error_of([&] { (void)zo::ckpt::SafetensorsFile::open(d.path / "twice.safetensors"); });
  EXPECT_HAS(e, "twice.safetensors");
  EXPECT_HAS(e, "key \"t\" appears twice");
}

TEST(SafetensorsInput, NonRegularFilesAreRefusedWithoutBlocking) {
  Scratch d;
  const fs::path fifo = d.path / "pipe.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string e =
      zo::test::error_without_blocking(fifo, [&] { (void)zo::ckpt::SafetensorsFile::open(fifo); });
  EXPECT_HAS(e, "pipe.safetensors");
  EXPECT_HAS(e, "is a FIFO (named pipe), not a regular file");
  EXPECT_HAS(error_of([] { (void)zo::ckpt::SafetensorsFile::open("/dev/null"); }),
             "is a character device, not a regular file");
  EXPECT_HAS(error_of([&] { (void)zo::ckpt::SafetensorsFile::open(d.path); }),
             "is a directory, not a regular file");
}

TEST(ReadFile, NonRegularFilesAreRefusedWithoutBlocking) {
  Scratch d;
  const fs::path fifo = d.path / "state.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_HAS(zo::test::error_without_blocking(fifo, [&] { (void)zo::ckpt::read_file(fifo); }),
             "'" + fifo.string() + "': it is a FIFO (named pipe)");
  EXPECT_HAS(error_of([] { (void)zo::ckpt::read_file("/dev/zero"); }), "character device");
}

// A committed checkpoint directory with three files, then damaged by each test.
class ManifestInput : public ::testing::Test {
 protected:
  void SetUp() override {
    zo::ckpt::AtomicDirectory d(dir_);
    d.write_file("model.safetensors", std::string(100, 'm'));
    d.write_file("trainer_state.json", std::string_view("{}"));
    d.write_file("sub/extra.bin", std::string_view("x"));
    d.commit();
    zo::ckpt::verify_directory(dir_);
  }
  std::string verify_error() {
    return error_of([&] { zo::ckpt::verify_directory(dir_); });
  }
  Scratch tmp_;
  fs::path dir_ = tmp_.path / "step_00000001";
};

TEST_F(ManifestInput, FilesTheManifestDoesNotListAreRefused) {
  write_text(dir_ / "notes.txt", "a file someone added");
  write_text(dir_ / "sub/more.bin", "another");
  std::string e = verify_error();
  EXPECT_HAS(e, "'notes.txt', 'sub/more.bin' are not listed in MANIFEST.json");
  EXPECT_HAS(e, "move files that are not part of the checkpoint out of its directory");
  fs::remove(dir_ / "notes.txt");
  fs::remove(dir_ / "sub/more.bin");
  ASSERT_EQ(::mkfifo((dir_ / "pipe").c_str(), 0600), 0);
  EXPECT_HAS(verify_error(), "'pipe' is not listed");
  fs::remove(dir_ / "pipe");
  fs::create_directory(dir_ / "empty");  // holds nothing that could be read
  EXPECT_NO_THROW(zo::ckpt::verify_directory(dir_));
}

TEST_F(ManifestInput, AListedFileThatIsAFifoIsRefusedWithoutBlocking) {
  fs::remove(dir_ / "trainer_state.json");
  ASSERT_EQ(::mkfifo((dir_ / "trainer_state.json").c_str(), 0600), 0);
  const std::string e = zo::test::error_without_blocking(dir_ / "trainer_state.json",
                                                         [&] { zo::ckpt::verify_directory(dir_); });
  EXPECT_HAS(e, "'trainer_state.json' is a FIFO (named pipe), not a regular file");
}

TEST_F(ManifestInput, DeepRepeatedOrNonRegularManifestsAreRefused) {
  const fs::path m = dir_ / "MANIFEST.json";
  const std::string text = zo::ckpt::read_file(m);
  write_text(m, R"({"files": [{"path": "model.safetensors", "size": )" + nested(1 << 20) +
                    R"(, "crc32c": "00000000"}]})");
  EXPECT_HAS(verify_error(), "deeper than 64 levels");
  // A second "files" key would hide the first.
  write_text(m, text.substr(0, text.rfind('}')) + R"(, "files": []})");
  EXPECT_HAS(verify_error(), "key \"files\" appears twice");
  // One path listed twice (in a version-1 manifest, which has no checksum of its own).
  nlohmann::json doc = parse_json(text);
  doc.erase("manifest_crc32c");
  doc["version"] = 1;
  doc["files"].push_back(doc["files"][0]);
  write_text(m, doc.dump());
  EXPECT_HAS(verify_error(), "is listed twice");
  fs::remove(m);
  ASSERT_EQ(::mkfifo(m.c_str(), 0600), 0);
  EXPECT_HAS(zo::test::error_without_blocking(m, [&] { zo::ckpt::verify_directory(dir_); }),
             "is a FIFO (named pipe)");
}

}  // namespace
