// Internals of the checkpoint files' I/O, not part of the atomic_io.h API: owned descriptors,
// fsynced checksumming writes, error messages with a fix. Shared by atomic_file.cpp,
// atomic_directory.cpp, manifest.cpp and rotation.cpp (the safetensors files use errno_text).
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

#include "checkpoint/atomic_io.h"

namespace zo::ckpt {

// Write/read chunk: big enough for full speed.
inline constexpr std::size_t kBufferBytes = 4u << 20;

std::string quoted(const std::filesystem::path& p);
std::string errno_text(int err);
std::filesystem::path parent_or_dot(const std::filesystem::path& p);

// What the user can do about an OS error while writing into `dir`.
std::string write_hint(int err, const std::filesystem::path& dir);
[[noreturn]] void throw_write_error(std::string_view action, const std::filesystem::path& path,
                                    int err, const std::filesystem::path& dir);

std::string unique_suffix();

// Owns a file descriptor; close errors on the normal path are checked by close_checked().
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
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
  explicit TempFileGuard(std::filesystem::path p) : path_(std::move(p)) {}
  ~TempFileGuard() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  void release() { path_.clear(); }

 private:
  std::filesystem::path path_;
};

// Opens `path` read-only if it is a regular file (symlinks followed). The type is checked with
// stat before the open, and the open is non-blocking, so a FIFO, device, socket or directory
// given by mistake is refused instead of blocking forever or being read as data. On failure the
// Fd is invalid and `problem` says why: "cannot be opened (<errno text>)" or "is a FIFO (named
// pipe), not a regular file".
Fd open_regular_file(const std::filesystem::path& path, std::string& problem);

struct WriteResult {
  std::uint64_t size;
  std::uint32_t crc;
};

// Creates (or truncates) `path`, streams the producer into it and fsyncs it. On failure the file
// is removed by the caller's guard.
WriteResult write_and_sync(const std::filesystem::path& path, int open_flags,
                           const ByteProducer& produce, const std::filesystem::path& dir);

// fsync a directory so that renames and creations in it are durable. File systems that cannot
// sync directories (EINVAL) are accepted as they are.
void fsync_dir(const std::filesystem::path& dir);

// A relative path that stays inside its directory: no root, no "..", no empty name.
bool is_safe_relative(const std::filesystem::path& p);

// MANIFEST.json's text for `manifest` (its files sorted by path).
std::string manifest_text(const Manifest& manifest);

// The writer record's text (kWriterRecordName) for this process, writing for `owner`.
std::string writer_record_text(const std::string& owner);

}  // namespace zo::ckpt
