// MANIFEST.json: its text (written by AtomicDirectory::commit) and verify_directory(), which
// checks a checkpoint directory's files against it.
#include "checkpoint/atomic_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

#include "checkpoint/atomic_io_internal.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/json_input.h"

namespace zo::ckpt {
namespace fs = std::filesystem;

namespace {

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

Manifest parse_manifest(const fs::path& dir, const std::string& text) {
  nlohmann::json doc;
  try {
    doc = parse_json(text);
  } catch (const JsonError& e) {
    throw_bad_manifest(dir, std::string("invalid JSON: ") + e.what());
  }
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
    const auto [ptr, err] = std::from_chars(hex.data(), hex.data() + hex.size(), e.crc32c, 16);
    if (err != std::errc() || ptr != hex.data() + hex.size() || hex.size() != 8) {
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
                                      {"version", 1},
                                      {"checksum", "crc32c"},
                                      {"files", std::move(files)}};
  return doc.dump(2) + "\n";
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

Manifest verify_directory(const fs::path& dir) {
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
  std::vector<std::byte> buf(kBufferBytes);
  for (const ManifestEntry& e : m.files) {
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
