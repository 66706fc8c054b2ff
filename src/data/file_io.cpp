#include "data/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <type_traits>
#include <utility>

#include "data/token_source.h"

namespace zo::data::detail {

std::string errno_message(int err) {
  char buf[256] = {};
  // GNU strerror_r may return a static string instead of filling buf; handle both variants.
  auto result = strerror_r(err, buf, sizeof buf);
  if constexpr (std::is_same_v<decltype(result), char*>) {
    return result;
  } else {
    return result == 0 ? std::string(buf) : "errno " + std::to_string(err);
  }
}

File File::open(const std::string& path) {
  File f;
  f.path_ = path;
  // O_NONBLOCK: opening a FIFO must not hang waiting for a writer; it is rejected below.
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (f.fd_ < 0) {
    const int err = errno;
    if (err == ENOENT) {
      throw DataError("data file '" + path + "' does not exist: check the --data path (a file, " +
                      "a directory of *.bin shards, a glob such as 'dir/*.bin', or 'synthetic')");
    }
    if (err == EACCES) {
      throw DataError("cannot read data file '" + path +
                      "': permission denied; fix its permissions (chmod a+r) or run as a user "
                      "who can read it");
    }
    throw DataError("cannot open data file '" + path + "': " + errno_message(err));
  }
  struct stat st {};
  if (::fstat(f.fd_, &st) != 0) {
    throw DataError("cannot stat data file '" + path + "': " + errno_message(errno));
  }
  if (S_ISDIR(st.st_mode)) {
    throw DataError("'" + path + "' is a directory where a data file was expected");
  }
  if (!S_ISREG(st.st_mode)) {
    throw DataError("data file '" + path +
                    "' is not a regular file (a pipe or device?); the loader needs random "
                    "access, so copy the data into a regular file");
  }
  return f;
}

File::File(File&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

uint64_t File::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    throw DataError("cannot stat data file '" + path_ + "': " + errno_message(errno));
  }
  return static_cast<uint64_t>(st.st_size);
}

void File::read_at(uint64_t offset, void* dst, size_t n) const {
  auto* out = static_cast<char*>(dst);
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd_, out + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw DataError("error reading data file '" + path_ + "' at byte " +
                      std::to_string(offset + done) + ": " + errno_message(errno));
    }
    if (got == 0) {
      throw DataError("data file '" + path_ + "' ended at byte " + std::to_string(offset + done) +
                      " while reading " + std::to_string(n) + " bytes at byte " +
                      std::to_string(offset) +
                      ": it shrank after it was opened; do not modify data files during a run");
    }
    done += static_cast<size_t>(got);
  }
}

}  // namespace zo::data::detail
