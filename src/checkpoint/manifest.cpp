// MANIFEST.json: its text (written by AtomicDirectory::commit) and verify_directory(), which
// checks a checkpoint directory's files against it.
#include "checkpoint/atomic_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

#include "checkpoint/atomic_io_internal.h"
#include "checkpoint/json_input.h"
#include "core/crc32c.h"

namespace zo::ckpt {
namespace fs = std::filesystem;

namespace {

constexpr const char* kSelfChecksumKey = "manifest_crc32c";
constexpr const char* kZeroDigits = "00000000";

// How the field's value starts in the text manifest_text writes (nlohmann's dump(2)).
const std::string& self_checksum_prefix() {
  // Built by append: GCC 12 warns falsely on "..." + std::string (PR 105329).
  static const std::string prefix = std::string("\"").append(kSelfChecksumKey).append("\": \"");
  return prefix;
}

std::string crc_hex(std::uint32_t crc) {
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", crc);
  return hex;
}

[[noreturn]] void throw_bad_manifest(const fs::path& dir, const std::string& what) {
  throw CheckpointError("checkpoint " + quoted(dir) + ": " + std::string(kManifestName) +
                        " is corrupted (" + what +
                        "). Do not use this checkpoint; resume from an older one.");
}

bool parse_crc(const std::string& hex, std::uint32_t& crc) {
  const auto [ptr, err] = std::from_chars(hex.data(), hex.data() + hex.size(), crc, 16);
  return err == std::errc() && ptr == hex.data() + hex.size() && hex.size() == 8;
}

// The manifest's own checksum: CRC-32C of its whole text with the eight digits of its
// "manifest_crc32c" value read as zeros. Every other byte is covered, and a change to those
// digits no longer matches the rest; a manifest written before the field existed (version 1)
// has none and is read as before.
void check_self_checksum(const fs::path& dir, const std::string& text, const nlohmann::json& doc) {
  const bool has = doc.is_object() && doc.contains(kSelfChecksumKey);
  if (!has) {
    if (doc.is_object() && doc.value("version", nlohmann::json()) == 1) return;
    throw_bad_manifest(dir,
                       "its own checksum \"" + std::string(kSelfChecksumKey) + "\" is missing");
  }
  const nlohmann::json& value = doc[kSelfChecksumKey];
  std::uint32_t stored = 0;
  const std::size_t at = text.rfind(self_checksum_prefix());
  if (!value.is_string() || !parse_crc(value.get<std::string>(), stored) ||
      at == std::string::npos ||
      text.compare(at + self_checksum_prefix().size(), 8, value.get<std::string>()) != 0) {
    throw_bad_manifest(dir, "its own checksum is not 8 hex digits in the written form");
  }
  std::string zeroed = text;
  zeroed.replace(at + self_checksum_prefix().size(), 8, kZeroDigits);
  const std::uint32_t crc = crc32c(zeroed);
  if (crc != stored) {
    throw_bad_manifest(dir, "its text was changed after it was written: CRC-32C " + crc_hex(crc) +
                                ", expected " + crc_hex(stored));
  }
}

Manifest parse_manifest(const fs::path& dir, const std::string& text) {
  nlohmann::json doc;
  try {
    doc = parse_json(text);
  } catch (const JsonError& e) {
    throw_bad_manifest(dir, std::string("invalid JSON: ") + e.what());
  }
  check_self_checksum(dir, text, doc);
  if (!doc.is_object() || !doc.contains("files") || !doc["files"].is_array()) {
    throw_bad_manifest(dir, "no \"files\" array");
  }
  Manifest m;
  std::set<std::string> seen;
  for (const auto& f : doc["files"]) {
    if (!f.is_object() || !f.contains("path") || !f["path"].is_string() || !f.contains("size") ||
        !f["size"].is_number_unsigned() || !f.contains("crc32c") || !f["crc32c"].is_string()) {
      throw_bad_manifest(dir, "an entry lacks path, size or crc32c: " + f.dump());
    }
    ManifestEntry e;
    e.path = f["path"].get<std::string>();
    e.size = f["size"].get<std::uint64_t>();
    const std::string hex = f["crc32c"].get<std::string>();
    if (!parse_crc(hex, e.crc32c)) {
      throw_bad_manifest(dir, "bad crc32c '" + hex + "' for '" + e.path + "'");
    }
    if (!is_safe_relative(fs::path(e.path)) || e.path == kManifestName) {
      throw_bad_manifest(dir, "entry path '" + e.path + "' points outside the directory");
    }
    if (!seen.insert(e.path).second) throw_bad_manifest(dir, "'" + e.path + "' is listed twice");
    m.files.push_back(std::move(e));
  }
  return m;
}

}  // namespace

bool is_safe_relative(const fs::path& p) {
  if (p.empty() || p.is_absolute() || p.has_root_name() || p.has_root_directory()) return false;
  for (const auto& part : p) {
    if (part == ".." || part == ".") return false;
  }
  return !p.filename().empty();
}

std::string manifest_text(const Manifest& manifest) {
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (const ManifestEntry& f : manifest.files) {
    files.push_back({{"path", f.path}, {"size", f.size}, {"crc32c", crc_hex(f.crc32c)}});
  }
  const nlohmann::ordered_json doc = {{"format", "offload_train checkpoint"},
                                      {"version", 2},
                                      {"checksum", "crc32c"},
                                      {"files", std::move(files)},
                                      {kSelfChecksumKey, kZeroDigits}};
  std::string text = doc.dump(2) + "\n";
  const std::size_t at = text.rfind(self_checksum_prefix()) + self_checksum_prefix().size();
  text.replace(at, 8, crc_hex(crc32c(text)));
  return text;
}

// Every entry under `dir` other than a directory, relative and '/'-separated, sorted.
std::vector<std::string> files_under(const fs::path& dir, std::vector<std::string>& problems) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (!it->is_directory(ec) || it->is_symlink(ec)) {
      out.push_back(it->path().lexically_relative(dir).generic_string());
    }
  }
  if (ec) problems.push_back("its files cannot be listed (" + errno_text(ec.value()) + ")");
  std::sort(out.begin(), out.end());
  return out;
}

Manifest verify_directory(const fs::path& dir, std::span<const std::string> only) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw CheckpointError("checkpoint " + quoted(dir) +
                          " does not exist or is not a directory. Check --resume / "
                          "--checkpoint-dir.");
  }
  const fs::path manifest_path = dir / kManifestName;
  if (!fs::exists(fs::symlink_status(manifest_path, ec))) {
    throw CheckpointError("checkpoint " + quoted(dir) + " has no " + std::string(kManifestName) +
                          ": it is incomplete (its write was interrupted) or was not written by "
                          "offload_train. Do not use it; resume from an older checkpoint.");
  }
  const Manifest m = parse_manifest(dir, read_file(manifest_path, 64u << 20));

  std::vector<std::string> problems;
  // A file the manifest does not list was not written by the checkpoint's writer: refused, so
  // that what is loaded is exactly what was checksummed.
  const std::vector<std::string> present = files_under(dir, problems);
  std::set<std::string> listed{std::string(kManifestName)};
  for (const ManifestEntry& e : m.files)
    listed.insert(e.path);
  std::vector<std::string> unlisted;
  for (const std::string& f : present) {
    if (!listed.count(f)) unlisted.push_back(f);
  }
  if (!unlisted.empty()) {
    std::string list;
    for (std::size_t i = 0; i < unlisted.size() && i < 8; ++i)
      list += (i ? ", '" : "'") + unlisted[i] + "'";
    if (unlisted.size() > 8) list += ", ... (" + std::to_string(unlisted.size()) + " in all)";
    problems.push_back(list + (unlisted.size() == 1 ? " is" : " are") + " not listed in " +
                       std::string(kManifestName) +
                       " (move files that are not part of the checkpoint out of its directory)");
  }
  for (const std::string& name : only) {
    if (!listed.count(name)) problems.push_back("'" + name + "' is not listed in its manifest");
  }
  std::vector<std::byte> buf(kBufferBytes);
  for (const ManifestEntry& e : m.files) {
    if (!only.empty() && std::find(only.begin(), only.end(), e.path) == only.end()) continue;
    if (!std::binary_search(present.begin(), present.end(), e.path)) {
      problems.push_back("'" + e.path + "' is missing");
      continue;
    }
    std::string problem;
    Fd fd = open_regular_file(dir / e.path, problem);
    struct stat st {};
    if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0) {
      problems.push_back("'" + e.path + "' " + (fd.get() < 0 ? problem : errno_text(errno)));
      continue;
    }
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (size != e.size) {
      problems.push_back("'" + e.path + "' " +
                         (size < e.size ? "is truncated: " : "has the wrong size: ") +
                         std::to_string(size) + " bytes, expected " + std::to_string(e.size));
      continue;
    }
    std::uint32_t crc = 0;
    std::uint64_t total = 0;
    bool read_failed = false;
    for (;;) {
      const ssize_t got = ::read(fd.get(), buf.data(), buf.size());
      if (got < 0) {
        if (errno == EINTR) continue;
        problems.push_back("'" + e.path + "' cannot be read (" + errno_text(errno) + ")");
        read_failed = true;
        break;
      }
      if (got == 0) break;
      crc = crc32c(std::span(buf.data(), static_cast<std::size_t>(got)), crc);
      total += static_cast<std::uint64_t>(got);
    }
    if (read_failed) continue;
    if (total != e.size) {
      problems.push_back("'" + e.path + "' changed size while being verified");
    } else if (crc != e.crc32c) {
      problems.push_back("'" + e.path + "' is corrupted: CRC-32C " + crc_hex(crc) + ", expected " +
                         crc_hex(e.crc32c));
    }
  }
  if (!problems.empty()) {
    std::string msg = "checkpoint " + quoted(dir) + " failed verification: ";
    for (std::size_t i = 0; i < problems.size(); ++i)
      msg += (i ? "; " : "") + problems[i];
    msg += ". Do not use this checkpoint; resume from an older one.";
    throw CheckpointError(msg);
  }
  return m;
}

}  // namespace zo::ckpt
