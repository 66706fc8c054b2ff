// Single files written atomically and read whole, and the descriptor, fsync and error-message
// plumbing (atomic_io_internal.h) that AtomicDirectory and the manifest share.
#include "checkpoint/atomic_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <system_error>
#include <utility>
#include <vector>

#include "checkpoint/atomic_io_internal.h"
#include "core/crc32c.h"

namespace zo::ckpt {
namespace fs = std::filesystem;

std::string quoted(const fs::path& p) {
  return "'" + p.native() + "'";
}

std::string errno_text(int err) {
  return std::error_code(err, std::generic_category()).message();
}

fs::path parent_or_dot(const fs::path& p) {
  fs::path parent = p.parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

std::string write_hint(int err, const fs::path& dir) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return "Free disk space (or quota) on the file system holding " + quoted(dir) +
             ", or write elsewhere (another --checkpoint-dir, -o, ...).";
    case EACCES:
    case EPERM:
    case EROFS:
      return "Fix the permissions of " + quoted(dir) + ", or write elsewhere.";
    case ENOENT:
    case ENOTDIR:
      return "Create the directory " + quoted(dir) + ", or write elsewhere.";
    case EFBIG:
      return "The file exceeds the file size limit (see `ulimit -f`) or what the file system "
             "supports; raise the limit, or write elsewhere.";
    case EIO:
      return "The device reported an I/O error; check it (dmesg), and write elsewhere.";
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

namespace {

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

}  // namespace

void fsync_dir(const fs::path& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) throw_write_error("open directory", dir, errno, dir);
  if (::fsync(fd.get()) != 0 && errno != EINVAL) {
    throw_write_error("fsync directory", dir, errno, dir);
  }
}

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

void replace_files(const fs::path& from, std::span<const std::string> names, const fs::path& to,
                   std::span<const std::string> retire) {
  struct Move {
    fs::path src, dst;
  };
  std::vector<Move> done;  // to undo, last first
  const auto move = [&](const fs::path& src, const fs::path& dst) {
    if (::rename(src.c_str(), dst.c_str()) == 0) {
      done.push_back({src, dst});
      return;
    }
    const int err = errno;
    for (auto it = done.rbegin(); it != done.rend(); ++it)
      ::rename(it->dst.c_str(), it->src.c_str());  // frees names: nothing to fail on
    throw_write_error("move a finished file into place as", dst, err, to);
  };
  const auto set_aside = [&](const std::string& name) {
    std::error_code ec;
    if (fs::exists(fs::symlink_status(to / name, ec)))
      move(to / name, from / (".previous-" + name));
  };
  for (const std::string& name : retire)
    set_aside(name);
  for (const std::string& name : names) {
    set_aside(name);
    move(from / name, to / name);
  }
  fsync_dir(to);
}

void write_file_atomic(const fs::path& path, std::span<const std::byte> bytes) {
  write_file_atomic(path, [bytes](const ByteSink& sink) { sink(bytes); });
}

void write_file_atomic(const fs::path& path, std::string_view text) {
  write_file_atomic(path, std::as_bytes(std::span(text.data(), text.size())));
}

namespace {

std::string type_problem(mode_t mode) {
  const char* type = S_ISDIR(mode)    ? "a directory"
                     : S_ISFIFO(mode) ? "a FIFO (named pipe)"
                     : S_ISCHR(mode)  ? "a character device"
                     : S_ISBLK(mode)  ? "a block device"
                     : S_ISSOCK(mode) ? "a socket"
                                      : "something else";
  return std::string("is ") + type + ", not a regular file";
}

std::string open_problem(int err) {
  return err == ENOENT ? "does not exist" : "cannot be opened (" + errno_text(err) + ")";
}

}  // namespace

Fd open_regular_file(const fs::path& path, std::string& problem) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    problem = open_problem(errno);
    return Fd();
  }
  // Opened only if regular, non-blocking in case it became a FIFO since; then checked again.
  const bool regular = S_ISREG(st.st_mode);
  Fd fd(regular ? ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK) : -1);
  if (regular && (fd.get() < 0 || ::fstat(fd.get(), &st) != 0)) {
    problem = open_problem(errno);
    return Fd();
  }
  if (!S_ISREG(st.st_mode)) {
    problem = type_problem(st.st_mode);
    return Fd();
  }
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags >= 0) ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

std::string read_file(const fs::path& path, std::uint64_t max_bytes) {
  std::string problem;
  Fd fd = open_regular_file(path, problem);
  if (fd.get() < 0) throw CheckpointError("cannot read " + quoted(path) + ": it " + problem + ".");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    throw CheckpointError("cannot read " + quoted(path) + ": " + errno_text(errno) + ".");
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

}  // namespace zo::ckpt
