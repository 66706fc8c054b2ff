#include "checkpoint/atomic_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>  // renameat2 (glibc >= 2.28)
#include <cstring>
#include <nlohmann/json.hpp>
#include <system_error>
#include <utility>

#include "checkpoint/crc32c.h"

namespace zo::ckpt {
namespace fs = std::filesystem;

namespace {

constexpr std::size_t kBufferBytes = 4u << 20;  // write/read chunk: big enough for full speed

std::string quoted(const fs::path& p) {
  return "'" + p.string() + "'";
}

std::string errno_text(int err) {
  return std::error_code(err, std::generic_category()).message();
}

fs::path parent_or_dot(const fs::path& p) {
  fs::path parent = p.parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

// What the user can do about an OS error while writing into `dir`.
std::string write_hint(int err, const fs::path& dir) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return "Free disk space (or quota) on the file system holding " + quoted(dir) +
             ", or choose another --checkpoint-dir.";
    case EACCES:
    case EPERM:
    case EROFS:
      return "Choose a writable --checkpoint-dir, or fix the permissions of " + quoted(dir) + ".";
    case ENOENT:
    case ENOTDIR:
      return "Create the directory " + quoted(dir) + " or choose another --checkpoint-dir.";
    case EFBIG:
      return "The file exceeds the file size limit (see `ulimit -f`) or what the file system "
             "supports; raise the limit or choose another --checkpoint-dir.";
    case EIO:
      return "The device reported an I/O error; check it (dmesg) and choose another "
             "--checkpoint-dir.";
    case EMFILE:
    case ENFILE:
      return "Too many open files; raise `ulimit -n`.";
    default:
      return "Check that " + quoted(dir) + " is a writable local directory with free space.";
  }
}

[[noreturn]] void throw_write_error(std::string_view action, const fs::path& path, int err,
                                    const fs::path& dir) {
  throw CheckpointError("cannot " + std::string(action) + " " + quoted(path) + ": " +
                        errno_text(err) + ". " + write_hint(err, dir));
}

// Unique within the process (counter) and across processes (pid) and time (clock).
std::string unique_suffix() {
  static std::atomic<std::uint64_t> counter{0};
  auto x = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  x ^= (counter.fetch_add(1) + 1) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 31;  // splitmix64 finaliser: spread the bits
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(x));
  return std::to_string(::getpid()) + "-" + std::string(hex, 8);
}

// Owns a file descriptor; close errors on the normal path are checked by close_checked().
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int close_checked() {  // returns 0 or errno
    const int fd = std::exchange(fd_, -1);
    return (fd >= 0 && ::close(fd) != 0) ? errno : 0;
  }

 private:
  int fd_;
};

// Removes a temporary file unless release()d.
class TempFileGuard {
 public:
  explicit TempFileGuard(fs::path p) : path_(std::move(p)) {}
  ~TempFileGuard() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  void release() { path_.clear(); }

 private:
  fs::path path_;
};

// Buffered writer over an open descriptor that counts bytes and checksums them.
class FileWriter {
 public:
  FileWriter(int fd, fs::path path, fs::path dir)
      : fd_(fd), path_(std::move(path)), dir_(std::move(dir)) {
    buffer_.reserve(kBufferBytes);
  }

  void append(std::span<const std::byte> chunk) {
    size_ += chunk.size();
    crc_ = crc32c(chunk, crc_);
    if (buffer_.size() + chunk.size() <= kBufferBytes) {
      buffer_.insert(buffer_.end(), chunk.begin(), chunk.end());
      return;
    }
    flush();
    if (chunk.size() >= kBufferBytes) {
      write_all(chunk);  // large chunks (tensor data) go straight to the file
    } else {
      buffer_.insert(buffer_.end(), chunk.begin(), chunk.end());
    }
  }

  void flush() {
    write_all(buffer_);
    buffer_.clear();
  }

  void sync() {
    flush();
    if (::fsync(fd_) != 0) throw_write_error("fsync", path_, errno, dir_);
  }

  std::uint64_t size() const { return size_; }
  std::uint32_t crc() const { return crc_; }

 private:
  void write_all(std::span<const std::byte> data) {
    const std::byte* p = data.data();
    std::size_t n = data.size();
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, std::min<std::size_t>(n, std::size_t{1} << 30));
      if (w < 0) {
        if (errno == EINTR) continue;
        throw_write_error("write", path_, errno, dir_);
      }
      p += w;
      n -= static_cast<std::size_t>(w);
    }
  }

  int fd_;
  fs::path path_;
  fs::path dir_;
  std::vector<std::byte> buffer_;
  std::uint64_t size_ = 0;
  std::uint32_t crc_ = 0;
};

std::atomic<bool> g_no_renameat2_flags{false};

int rename_with_flags(const fs::path& from, const fs::path& to, unsigned flags) {
  if (g_no_renameat2_flags.load(std::memory_order_relaxed)) {
    errno = EINVAL;
    return -1;
  }
  return ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags);
}

// fsync a directory so that renames and creations in it are durable. File systems that cannot
// sync directories (EINVAL) are accepted as they are.
void fsync_dir(const fs::path& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) throw_write_error("open directory", dir, errno, dir);
  if (::fsync(fd.get()) != 0 && errno != EINVAL) {
    throw_write_error("fsync directory", dir, errno, dir);
  }
}

struct WriteResult {
  std::uint64_t size;
  std::uint32_t crc;
};

// Creates (or truncates) `path`, streams the producer into it and fsyncs it. On failure the file
// is removed by the caller's guard.
WriteResult write_and_sync(const fs::path& path, int open_flags, const ByteProducer& produce,
                           const fs::path& dir) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | open_flags, 0666));
  if (fd.get() < 0) throw_write_error("create", path, errno, dir);
  FileWriter writer(fd.get(), path, dir);
  produce([&writer](std::span<const std::byte> chunk) { writer.append(chunk); });
  writer.sync();
  if (const int err = fd.close_checked(); err != 0) throw_write_error("close", path, err, dir);
  return {writer.size(), writer.crc()};
}

// Reads a file through, checksumming it, and fsyncs it (it may have been written by anyone).
WriteResult checksum_and_sync(const fs::path& path, const fs::path& dir) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw_write_error("open", path, errno, dir);
  std::vector<std::byte> buf(kBufferBytes);
  WriteResult r{0, 0};
  for (;;) {
    const ssize_t got = ::read(fd.get(), buf.data(), buf.size());
    if (got < 0) {
      if (errno == EINTR) continue;
      throw_write_error("read back", path, errno, dir);
    }
    if (got == 0) break;
    r.crc = crc32c(std::span(buf.data(), static_cast<std::size_t>(got)), r.crc);
    r.size += static_cast<std::uint64_t>(got);
  }
  if (::fsync(fd.get()) != 0 && errno != EINVAL) throw_write_error("fsync", path, errno, dir);
  return r;
}

std::string crc_hex(std::uint32_t crc) {
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", crc);
  return hex;
}

// A relative path that stays inside its directory: no root, no "..", no empty name.
bool is_safe_relative(const fs::path& p) {
  if (p.empty() || p.is_absolute() || p.has_root_name() || p.has_root_directory()) return false;
  for (const auto& part : p) {
    if (part == ".." || part == ".") return false;
  }
  return !p.filename().empty();
}

}  // namespace

// ---- single files -------------------------------------------------------------------------------

void write_file_atomic(const fs::path& path, const ByteProducer& produce) {
  const fs::path dir = parent_or_dot(path);
  if (path.filename().empty()) {
    throw CheckpointError("cannot write " + quoted(path) +
                          ": the path names a directory, not a "
                          "file. Give a file name.");
  }
  const fs::path tmp = dir / (path.filename().string() + ".tmp-" + unique_suffix());
  TempFileGuard guard(tmp);
  // O_EXCL: never write through a stale file or symlink someone left under the temporary name.
  write_and_sync(tmp, O_EXCL, produce, dir);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    throw_write_error("rename the finished temporary file onto", path, errno, dir);
  }
  guard.release();
  fsync_dir(dir);
}

void write_file_atomic(const fs::path& path, std::span<const std::byte> bytes) {
  write_file_atomic(path, [bytes](const ByteSink& sink) { sink(bytes); });
}

void write_file_atomic(const fs::path& path, std::string_view text) {
  write_file_atomic(path, std::as_bytes(std::span(text.data(), text.size())));
}

std::string read_file(const fs::path& path, std::uint64_t max_bytes) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    throw CheckpointError("cannot open " + quoted(path) + ": " + errno_text(errno) + ".");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw CheckpointError("cannot read " + quoted(path) + ": not a regular file.");
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > max_bytes) {
    throw CheckpointError("cannot read " + quoted(path) + ": it has " + std::to_string(size) +
                          " bytes, more than the " + std::to_string(max_bytes) +
                          " expected for this file; it is not the file it should be.");
  }
  std::string out(static_cast<std::size_t>(size), '\0');
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t got = ::read(fd.get(), out.data() + done, out.size() - done);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError("cannot read " + quoted(path) + ": " + errno_text(errno) + ".");
    }
    if (got == 0) break;  // shrank meanwhile
    done += static_cast<std::size_t>(got);
  }
  out.resize(done);
  return out;
}

// ---- AtomicDirectory ----------------------------------------------------------------------------

AtomicDirectory::AtomicDirectory(fs::path final_path, IfExists if_exists)
    : final_(std::move(final_path)), if_exists_(if_exists) {
  if (final_.filename().empty()) final_ = final_.parent_path();  // "ckpt/step_1/" -> ".../step_1"
  if (final_.empty() || final_.filename() == "." || final_.filename() == "..") {
    throw CheckpointError("invalid checkpoint directory path " + quoted(final_) +
                          ": it must end in a directory name.");
  }
  const fs::path parent = parent_or_dot(final_);
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) {
    throw CheckpointError("cannot create the checkpoint directory " + quoted(parent) + ": " +
                          ec.message() + ". " + write_hint(ec.value(), parent));
  }
  if (if_exists_ == IfExists::kFail && fs::exists(fs::symlink_status(final_, ec))) {
    throw CheckpointError("checkpoint directory " + quoted(final_) +
                          " already exists; refusing to overwrite it. Remove it, or choose "
                          "another --checkpoint-dir.");
  }
  temp_ = parent / ("." + final_.filename().string() + ".tmp-" + unique_suffix());
  if (::mkdir(temp_.c_str(), 0777) != 0) {
    throw_write_error("create the temporary directory", temp_, errno, parent);
  }
  active_ = true;
}

AtomicDirectory::AtomicDirectory(AtomicDirectory&& other) noexcept
    : final_(std::move(other.final_)),
      temp_(std::move(other.temp_)),
      if_exists_(other.if_exists_),
      active_(std::exchange(other.active_, false)),
      committed_(other.committed_),
      written_(std::move(other.written_)) {}

AtomicDirectory::~AtomicDirectory() {
  if (!active_) return;
  try {
    std::error_code ec;
    fs::remove_all(temp_, ec);  // best effort: a leftover ".name.tmp-" dir is ignored by readers
  } catch (...) {
  }
}

void AtomicDirectory::write_file(std::string_view name, const ByteProducer& produce) {
  if (!active_ || committed_) {
    throw CheckpointError("AtomicDirectory " + quoted(final_) +
                          ": write_file after commit (or on a moved-from object).");
  }
  const fs::path rel = fs::path(name).lexically_normal();
  if (!is_safe_relative(rel) || rel.generic_string() == kManifestName) {
    throw CheckpointError("invalid file name '" + std::string(name) + "' in checkpoint " +
                          quoted(final_) + ": use a relative path inside the directory (not " +
                          std::string(kManifestName) + ").");
  }
  const fs::path path = temp_ / rel;
  const fs::path dir = path.parent_path();
  if (rel.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw_write_error("create directory", dir, ec.value(), dir);
  }
  TempFileGuard guard(path);
  const WriteResult r = write_and_sync(path, O_TRUNC, produce, dir);
  guard.release();
  written_[rel.generic_string()] = {r.size, r.crc};
}

void AtomicDirectory::write_file(std::string_view name, std::span<const std::byte> bytes) {
  write_file(name, [bytes](const ByteSink& sink) { sink(bytes); });
}

void AtomicDirectory::write_file(std::string_view name, std::string_view text) {
  write_file(name, std::as_bytes(std::span(text.data(), text.size())));
}

void AtomicDirectory::commit() {
  if (!active_ || committed_) {
    throw CheckpointError("AtomicDirectory " + quoted(final_) +
                          ": commit called twice (or on a moved-from object).");
  }
  const fs::path parent = parent_or_dot(final_);

  // 1. Every file: size and checksum (recorded, or read back), fsynced.
  Manifest manifest;
  std::vector<fs::path> dirs{temp_};
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(temp_, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    const fs::path& p = it->path();
    const std::string rel = p.lexically_relative(temp_).generic_string();
    const fs::file_status st = it->symlink_status(ec);
    if (ec) break;
    if (fs::is_directory(st)) {
      dirs.push_back(p);
      continue;
    }
    if (!fs::is_regular_file(st)) {
      throw CheckpointError("checkpoint " + quoted(final_) + ": '" + rel +
                            "' is not a regular file (symlink, socket, ...); a checkpoint may "
                            "only hold regular files.");
    }
    if (rel == kManifestName) {
      throw CheckpointError("checkpoint " + quoted(final_) + ": a file named " +
                            std::string(kManifestName) +
                            " was created by the caller; the name is "
                            "reserved for the manifest.");
    }
    WriteResult r{};
    const auto found = written_.find(rel);
    std::error_code size_ec;
    if (found != written_.end() && fs::file_size(p, size_ec) == found->second.size && !size_ec) {
      r = {found->second.size, found->second.crc};  // written and fsynced by write_file
    } else {
      r = checksum_and_sync(p, parent);
    }
    manifest.files.push_back({rel, r.size, r.crc});
  }
  if (ec) throw_write_error("list the temporary directory", temp_, ec.value(), parent);
  std::sort(manifest.files.begin(), manifest.files.end(),
            [](const ManifestEntry& a, const ManifestEntry& b) { return a.path < b.path; });

  // 2. The manifest, written last: its presence marks the directory complete.
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (const ManifestEntry& f : manifest.files) {
    files.push_back({{"path", f.path}, {"size", f.size}, {"crc32c", crc_hex(f.crc32c)}});
  }
  const nlohmann::ordered_json doc = {{"format", "offload_train checkpoint"},
                                      {"version", 1},
                                      {"checksum", "crc32c"},
                                      {"files", std::move(files)}};
  const std::string text = doc.dump(2) + "\n";
  const fs::path manifest_path = temp_ / kManifestName;
  {
    TempFileGuard guard(manifest_path);
    write_and_sync(
        manifest_path, O_EXCL,
        [&text](const ByteSink& sink) { sink(std::as_bytes(std::span(text.data(), text.size()))); },
        parent);
    guard.release();
  }
  for (auto d = dirs.rbegin(); d != dirs.rend(); ++d)
    fsync_dir(*d);

  // 3. Publish. renameat2 makes "refuse if present" and "swap with the old one" atomic.
  fs::path old_copy;  // the replaced checkpoint, deleted once the new one is durable
  if (rename_with_flags(temp_, final_, RENAME_NOREPLACE) != 0) {
    int err = errno;
    if (err == EINVAL || err == ENOSYS) {  // file system without renameat2 flags
      if (fs::symlink_status(final_, ec).type() == fs::file_type::not_found) {
        err = ::rename(temp_.c_str(), final_.c_str()) == 0 ? 0 : errno;
      } else {
        err = EEXIST;
      }
    }
    if (err == EEXIST || err == ENOTEMPTY) {
      if (if_exists_ == IfExists::kFail) {
        throw CheckpointError("checkpoint directory " + quoted(final_) +
                              " already exists; refusing to overwrite it (the new checkpoint was "
                              "discarded). Remove it, or choose another --checkpoint-dir.");
      }
      err = rename_with_flags(temp_, final_, RENAME_EXCHANGE) == 0 ? 0 : errno;
      if (err == 0) {
        old_copy = temp_;  // the exchange left the old directory under the temporary name
      } else if (err == EINVAL || err == ENOSYS) {
        // No atomic exchange here: move the old one aside first. A crash between the two renames
        // leaves no final directory, but both copies survive under hidden names.
        const fs::path aside =
            parent / ("." + final_.filename().string() + ".old-" + unique_suffix());
        if (::rename(final_.c_str(), aside.c_str()) != 0) {
          throw_write_error("move aside the old checkpoint", final_, errno, parent);
        }
        if (::rename(temp_.c_str(), final_.c_str()) != 0) {
          err = errno;
          ::rename(aside.c_str(), final_.c_str());  // put the old one back
          throw_write_error("rename the new checkpoint onto", final_, err, parent);
        }
        old_copy = aside;
        err = 0;
      }
    }
    if (err != 0) throw_write_error("rename the new checkpoint onto", final_, err, parent);
  }
  fsync_dir(parent);
  committed_ = true;
  active_ = false;
  if (!old_copy.empty()) {
    fs::remove_all(old_copy, ec);  // a leftover is harmless: hidden name, ignored by readers
    if (ec && old_copy == temp_) active_ = true;  // let the destructor retry
  }
}

// ---- verification -------------------------------------------------------------------------------

namespace {

[[noreturn]] void throw_bad_manifest(const fs::path& dir, const std::string& what) {
  throw CheckpointError("checkpoint " + quoted(dir) + ": " + std::string(kManifestName) +
                        " is corrupted (" + what +
                        "). Do not use this checkpoint; resume from an older one.");
}

Manifest parse_manifest(const fs::path& dir, const std::string& text) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw_bad_manifest(dir, std::string("invalid JSON: ") + e.what());
  }
  if (!doc.is_object() || !doc.contains("files") || !doc["files"].is_array()) {
    throw_bad_manifest(dir, "no \"files\" array");
  }
  Manifest m;
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
    m.files.push_back(std::move(e));
  }
  return m;
}

}  // namespace

Manifest verify_directory(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw CheckpointError("checkpoint " + quoted(dir) +
                          " does not exist or is not a directory. Check --resume / "
                          "--checkpoint-dir.");
  }
  const fs::path manifest_path = dir / kManifestName;
  if (!fs::is_regular_file(manifest_path, ec)) {
    throw CheckpointError("checkpoint " + quoted(dir) + " has no " + std::string(kManifestName) +
                          ": it is incomplete (its write was interrupted) or was not written by "
                          "offload_train. Do not use it; resume from an older checkpoint.");
  }
  const Manifest m = parse_manifest(dir, read_file(manifest_path, 64u << 20));

  std::vector<std::string> problems;
  std::vector<std::byte> buf(kBufferBytes);
  for (const ManifestEntry& e : m.files) {
    const fs::path p = dir / e.path;
    Fd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
    const int open_err = fd.get() < 0 ? errno : 0;
    struct stat st {};
    if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
      problems.push_back(
          "'" + e.path + "' is missing" +
          (open_err != 0 && open_err != ENOENT ? " (" + errno_text(open_err) + ")" : ""));
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

// ---- rotation -----------------------------------------------------------------------------------

std::string checkpoint_dir_name(std::string_view prefix, std::uint64_t step) {
  char digits[32];
  std::snprintf(digits, sizeof digits, "%08llu", static_cast<unsigned long long>(step));
  return std::string(prefix) + digits;
}

std::vector<CheckpointDir> list_checkpoints(const fs::path& parent, std::string_view prefix) {
  std::vector<CheckpointDir> out;
  std::error_code ec;
  const fs::file_status st = fs::status(parent, ec);
  if (st.type() == fs::file_type::not_found) return out;
  if (!fs::is_directory(st)) {
    throw CheckpointError("checkpoint directory " + quoted(parent) +
                          " is not a directory. Choose another --checkpoint-dir.");
  }
  for (auto it = fs::directory_iterator(parent, ec); !ec && it != fs::end(it); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string_view digits = std::string_view(name).substr(prefix.size());
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;  // temporary (".x.tmp-"), ".old-", or unrelated names
    }
    std::uint64_t step = 0;
    const auto [ptr, err] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
    if (err != std::errc() || ptr != digits.data() + digits.size()) continue;
    std::error_code ec2;
    if (!fs::is_directory(it->path(), ec2)) continue;
    if (!fs::is_regular_file(it->path() / kManifestName, ec2)) continue;  // incomplete
    out.push_back({it->path(), step});
  }
  if (ec) {
    throw CheckpointError("cannot list checkpoint directory " + quoted(parent) + ": " +
                          ec.message() + ".");
  }
  std::sort(out.begin(), out.end(), [](const CheckpointDir& a, const CheckpointDir& b) {
    return a.step != b.step ? a.step < b.step : a.path < b.path;
  });
  return out;
}

std::vector<fs::path> rotate_checkpoints(const fs::path& parent, std::string_view prefix,
                                         std::size_t keep_last_n) {
  std::vector<fs::path> deleted;
  if (keep_last_n == 0) return deleted;
  const std::vector<CheckpointDir> all = list_checkpoints(parent, prefix);
  if (all.size() <= keep_last_n) return deleted;
  for (std::size_t i = 0; i + keep_last_n < all.size(); ++i) {
    const fs::path& dir = all[i].path;
    std::error_code ec;
    // Manifest first: from here on the directory counts as incomplete and is never resumed from.
    fs::remove(dir / kManifestName, ec);
    if (!ec) fs::remove_all(dir, ec);
    if (ec) {
      throw CheckpointError("cannot delete old checkpoint " + quoted(dir) + ": " + ec.message() +
                            ". Delete it by hand, or check the permissions of " + quoted(parent) +
                            ".");
    }
    deleted.push_back(dir);
  }
  return deleted;
}

std::vector<fs::path> list_temporary_dirs(const fs::path& parent) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (auto it = fs::directory_iterator(parent, ec); !ec && it != fs::end(it); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > 1 && name[0] == '.' &&
        (name.find(".tmp-") != std::string::npos || name.find(".old-") != std::string::npos)) {
      out.push_back(it->path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<fs::path> latest_checkpoint(const fs::path& parent, std::string_view prefix) {
  const std::vector<CheckpointDir> all = list_checkpoints(parent, prefix);
  if (all.empty()) return std::nullopt;
  return all.back().path;
}

namespace detail {
void simulate_missing_renameat2_flags(bool on) {
  g_no_renameat2_flags.store(on);
}
}  // namespace detail

}  // namespace zo::ckpt
