// One rank's optimizer-state file on a drive (--state-dir): unnamed, preallocated, and read and
// written in 4 KiB-aligned pieces with O_DIRECT where the filesystem allows it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace zo::state_io {

// Offsets, sizes and buffer addresses of every transfer are multiples of this (O_DIRECT's rule
// for 4 KiB-sector drives, and the page size).
inline constexpr std::size_t kAlignment = 4096;

// A failed or refused transfer or file operation; the text names the file, what failed, the
// system's reason and what to do.
class IoError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct FileOptions {
  // O_DIRECT (no page cache: the state is touched once per step, and caching it would take the
  // host memory the tier exists to save). A filesystem that refuses it (tmpfs) gets buffered I/O,
  // and note() says so.
  bool direct = true;
};

// Throws IoError naming dir and the fix unless it is an existing directory: what StateFile::create
// checks first, for a caller that only plans (offload_train plan --state-dir).
void check_state_dir(const std::filesystem::path& dir);

class StateFile {
 public:
  // A file of `bytes` (rounded up to kAlignment) in directory `dir`, unnamed (O_TMPFILE; where
  // the filesystem has no unnamed files, a new unique name removed at once), so that nothing is
  // left on the drive when the process ends, crashes or is killed, and no existing file is ever
  // touched. The space is allocated now, so that a full drive or a file-size limit is found
  // before the first step. Throws IoError naming dir, the reason and the fix.
  static StateFile create(const std::filesystem::path& dir, std::uint64_t bytes,
                          const FileOptions& options = {});

  StateFile() = default;  // no file (a moved-from one is the same)
  StateFile(StateFile&& other) noexcept;
  StateFile& operator=(StateFile&& other) noexcept;
  StateFile(const StateFile&) = delete;
  StateFile& operator=(const StateFile&) = delete;
  ~StateFile();

  int fd() const { return fd_; }
  std::uint64_t size() const { return size_; }
  bool direct() const { return direct_; }
  // "the state file in DIR", for messages.
  const std::string& name() const { return name_; }
  // Why I/O is buffered ("" with O_DIRECT).
  const std::string& note() const { return note_; }

  // Whole transfers on the calling thread (short ones are continued); offset, bytes and data
  // aligned to kAlignment, within size(). Throw IoError.
  void read(std::uint64_t offset, void* data, std::size_t bytes) const;
  void write(std::uint64_t offset, const void* data, std::size_t bytes) const;

  // "the state file in DIR: <what> at byte <offset> (<bytes> bytes) failed: <errno text>; <fix>".
  std::string failure(const char* what, std::uint64_t offset, std::size_t bytes, int error) const;
  // The same for a transfer that moved nothing (the file is shorter than it was made).
  std::string nothing_moved(const char* what, std::uint64_t offset, std::size_t bytes) const;
  // Throws std::invalid_argument unless [offset, offset + bytes) and data are aligned and inside
  // the file.
  void check_transfer(std::uint64_t offset, const void* data, std::size_t bytes) const;

 private:
  StateFile(int fd, std::uint64_t size, bool direct, std::string name, std::string note);

  int fd_ = -1;
  std::uint64_t size_ = 0;
  bool direct_ = false;
  std::string name_, note_;
};

}  // namespace zo::state_io
