#include "state_io/state_file.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <utility>

#include "core/bytes.h"

namespace zo::state_io {
namespace fs = std::filesystem;
namespace {

std::string errno_text(int e) {
  return std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")";
}

// What to do about a failed transfer or allocation, by its errno.
std::string fix_for(int e) {
  switch (e) {
    case ENOSPC:
      return "the drive is full: free space on it, or choose another --state-dir";
    case EFBIG:
      return "the file-size limit (ulimit -f) is below the state's size: raise it";
    case EIO:
      return "the drive reported an error: check it (dmesg, smartctl), or choose another "
             "--state-dir";
    default:
      return "check the drive and the directory, or choose another --state-dir";
  }
}

// An unnamed file in dir: O_TMPFILE, else a fresh name removed at once. Never opens an existing
// file.
int open_unnamed(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  const int tmpfile_errno = errno;
  if (tmpfile_errno != EOPNOTSUPP && tmpfile_errno != EISDIR && tmpfile_errno != EINVAL) {
    throw IoError("--state-dir " + dir.string() + ": cannot create a file there: " +
                  errno_text(tmpfile_errno) + "; choose a writable directory");
  }
  std::random_device rd;
  for (int attempt = 0; attempt < 16; ++attempt) {
    const fs::path p = dir / ("offload_train-state-" + std::to_string(::getpid()) + "-" +
                              std::to_string(rd()) + ".tmp");
    fd = ::open(p.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::unlink(p.c_str());  // the space stays ours until the descriptor closes
      return fd;
    }
    if (errno != EEXIST) {
      throw IoError("--state-dir " + dir.string() + ": cannot create a file there: " +
                    errno_text(errno) + "; choose a writable directory");
    }
  }
  throw IoError("--state-dir " + dir.string() + ": no unused file name after 16 tries");
}

// Turns O_DIRECT on and moves one aligned block out and back; "" when the filesystem takes it,
// else why not (O_DIRECT is then off again).
std::string try_direct(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_DIRECT) != 0) {
    return "the filesystem refused O_DIRECT (" + errno_text(errno) + "): buffered I/O";
  }
  struct Free {
    void operator()(void* p) const noexcept { std::free(p); }
  };
  const std::unique_ptr<void, Free> block(std::aligned_alloc(kAlignment, kAlignment));
  if (!block) throw std::bad_alloc();
  std::memset(block.get(), 0, kAlignment);
  if (::pwrite(fd, block.get(), kAlignment, 0) == ssize_t(kAlignment) &&
      ::pread(fd, block.get(), kAlignment, 0) == ssize_t(kAlignment)) {
    return {};
  }
  const int e = errno;
  (void)::fcntl(fd, F_SETFL, flags);
  return "the filesystem refused O_DIRECT transfers (" + errno_text(e) + "): buffered I/O";
}

}  // namespace

void check_state_dir(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw IoError("--state-dir " + dir.string() +
                  (fs::exists(dir, ec) ? " is not a directory" : " does not exist") +
                  ": create the directory, or choose another");
  }
}

StateFile StateFile::create(const fs::path& dir, std::uint64_t bytes, const FileOptions& options) {
  check_state_dir(dir);
  const std::uint64_t size = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  const std::string name = "the state file in " + dir.string();
  // Beyond RLIMIT_FSIZE the kernel sends SIGXFSZ, which ends the process unless ignored: say why
  // instead, and let later writes fail with EFBIG.
  if (rlimit lim{}; ::getrlimit(RLIMIT_FSIZE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY &&
                    size > lim.rlim_cur) {
    throw IoError(name + ": needs " + format_bytes(size) +
                  " but the file-size limit (ulimit -f) is " + format_bytes(lim.rlim_cur) +
                  ": raise it, or give the state less room");
  }
  if (struct sigaction old{};
      ::sigaction(SIGXFSZ, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
    std::signal(SIGXFSZ, SIG_IGN);
  }
  const int fd = open_unnamed(dir);
  StateFile f(fd, size, false, name, {});
  if (size > 0) {
    if (const int e = ::posix_fallocate(fd, 0, off_t(size)); e != 0) {
      std::string free_space;
      if (struct statvfs s{}; ::statvfs(dir.c_str(), &s) == 0) {
        free_space = " (" + format_bytes(std::uint64_t(s.f_bavail) * s.f_frsize) + " free)";
      }
      throw IoError(name + ": cannot allocate " + format_bytes(size) + free_space + ": " +
                    errno_text(e) + "; " + fix_for(e));
    }
  }
  if (options.direct && size > 0) {
    f.note_ = try_direct(fd);
    f.direct_ = f.note_.empty();
  } else {
    f.note_ = "buffered I/O (asked for)";
  }
  return f;
}

StateFile::StateFile(int fd, std::uint64_t size, bool direct, std::string name, std::string note)
    : fd_(fd), size_(size), direct_(direct), name_(std::move(name)), note_(std::move(note)) {}

StateFile::StateFile(StateFile&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)),
      size_(o.size_),
      direct_(o.direct_),
      name_(std::move(o.name_)),
      note_(std::move(o.note_)) {}

StateFile& StateFile::operator=(StateFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    size_ = o.size_;
    direct_ = o.direct_;
    name_ = std::move(o.name_);
    note_ = std::move(o.note_);
  }
  return *this;
}

StateFile::~StateFile() {
  if (fd_ >= 0) ::close(fd_);
}

void StateFile::check_transfer(std::uint64_t offset, const void* data, std::size_t bytes) const {
  const auto address = reinterpret_cast<std::uintptr_t>(data);
  if (bytes == 0 || offset % kAlignment != 0 || bytes % kAlignment != 0 ||
      address % kAlignment != 0 || offset > size_ || bytes > size_ - offset) {
    throw std::invalid_argument(name_ + ": a transfer of " + std::to_string(bytes) +
                                " bytes at byte " + std::to_string(offset) +
                                " is not 4 KiB-aligned inside the file's " + std::to_string(size_) +
                                " bytes, or its buffer is not 4 KiB-aligned");
  }
}

std::string StateFile::failure(const char* what, std::uint64_t offset, std::size_t bytes,
                               int error) const {
  return name_ + ": " + what + " at byte " + std::to_string(offset) + " (" + std::to_string(bytes) +
         " bytes) failed: " + errno_text(error) + "; " + fix_for(error);
}

std::string StateFile::nothing_moved(const char* what, std::uint64_t offset,
                                     std::size_t bytes) const {
  return name_ + ": " + what + " at byte " + std::to_string(offset) + " (" + std::to_string(bytes) +
         " bytes) moved no bytes (the file is shorter than it was made: " +
         "changed by another program?); choose a --state-dir nothing else writes to";
}

void StateFile::read(std::uint64_t offset, void* data, std::size_t bytes) const {
  check_transfer(offset, data, bytes);
  for (std::size_t done = 0; done < bytes;) {
    const ssize_t r =
        ::pread(fd_, static_cast<char*>(data) + done, bytes - done, off_t(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw IoError(failure("read", offset + done, bytes - done, errno));
    if (r == 0) throw IoError(nothing_moved("read", offset + done, bytes - done));
    done += std::size_t(r);
  }
}

void StateFile::write(std::uint64_t offset, const void* data, std::size_t bytes) const {
  check_transfer(offset, data, bytes);
  for (std::size_t done = 0; done < bytes;) {
    const ssize_t r =
        ::pwrite(fd_, static_cast<const char*>(data) + done, bytes - done, off_t(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw IoError(failure("write", offset + done, bytes - done, errno));
    if (r == 0) throw IoError(nothing_moved("write", offset + done, bytes - done));
    done += std::size_t(r);
  }
}

}  // namespace zo::state_io
