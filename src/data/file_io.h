// POSIX file access for the data module (internal): open/fstat/pread with errors that name the
// file and say what to do. pread instead of mmap so a shard that is truncated or replaced while
// training gives a DataError instead of SIGBUS.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace zo::data::detail {

class File {
 public:
  // Opens read-only. DataError: missing file, permission denied, a directory, other errno.
  static File open(const std::string& path);

  File() = default;
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  uint64_t size() const;  // current size from fstat

  // Reads exactly n bytes at offset; DataError naming the file on an I/O error or a short read
  // (the file shrank since it was validated).
  void read_at(uint64_t offset, void* dst, size_t n) const;

 private:
  int fd_ = -1;
  std::string path_;
};

std::string errno_message(int err);  // strerror_r, thread-safe

}  // namespace zo::data::detail
