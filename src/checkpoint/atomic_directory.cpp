// AtomicDirectory: a checkpoint directory built under a temporary name and published, manifest
// last, by one rename (renameat2 where the file system has its flags, a portable fallback else).
#include "checkpoint/atomic_io.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>  // renameat2 (glibc >= 2.28)
#include <system_error>
#include <utility>
#include <vector>

#include "checkpoint/atomic_io_internal.h"
#include "core/crc32c.h"

namespace zo::ckpt {
namespace fs = std::filesystem;

namespace {

std::atomic<bool> g_no_renameat2_flags{false};

int rename_with_flags(const fs::path& from, const fs::path& to, unsigned flags) {
  if (g_no_renameat2_flags.load(std::memory_order_relaxed)) {
    errno = EINVAL;
    return -1;
  }
  return ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags);
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

}  // namespace

AtomicDirectory::AtomicDirectory(fs::path final_path, IfExists if_exists, const std::string& owner)
    : final_(std::move(final_path)), if_exists_(if_exists), has_record_(!owner.empty()) {
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
  temp_ = parent / ("." + final_.filename().native() + ".tmp-" + unique_suffix());
  if (::mkdir(temp_.c_str(), 0777) != 0) {
    throw_write_error("create the temporary directory", temp_, errno, parent);
  }
  active_ = true;
  if (!has_record_) return;
  // Locked before the record exists, for as long as this object lives: a remover that cannot see
  // this pid (another PID namespace) tells a live writer by the lock (still_writing). Best effort:
  // where flock fails, such a remover keeps the directory.
  lock_fd_ = ::open(temp_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (lock_fd_ >= 0) ::flock(lock_fd_, LOCK_EX | LOCK_NB);
  const std::string text = writer_record_text(owner);
  try {
    write_and_sync(
        temp_ / kWriterRecordName, O_EXCL,
        [&text](const ByteSink& sink) { sink(std::as_bytes(std::span(text.data(), text.size()))); },
        parent);
  } catch (...) {
    std::error_code removed;
    fs::remove_all(temp_, removed);  // no destructor runs for a constructor that throws
    if (lock_fd_ >= 0) ::close(lock_fd_);
    throw;
  }
}

AtomicDirectory::AtomicDirectory(AtomicDirectory&& other) noexcept
    : final_(std::move(other.final_)),
      temp_(std::move(other.temp_)),
      if_exists_(other.if_exists_),
      has_record_(other.has_record_),
      lock_fd_(std::exchange(other.lock_fd_, -1)),
      active_(std::exchange(other.active_, false)),
      committed_(other.committed_),
      written_(std::move(other.written_)) {}

AtomicDirectory::~AtomicDirectory() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
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
  if (has_record_ && ::unlink((temp_ / kWriterRecordName).c_str()) != 0) {
    throw_write_error("remove the writer record", temp_ / kWriterRecordName, errno, parent);
  }

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
  const std::string text = manifest_text(manifest);
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
      if (!fs::is_regular_file(final_ / kManifestName, ec)) {
        throw CheckpointError(quoted(final_) +
                              " is in the way and is not a complete checkpoint (no " +
                              std::string(kManifestName) +
                              "); refusing to replace it (the new checkpoint was discarded). "
                              "Move it out of the way, or choose another --checkpoint-dir.");
      }
      err = rename_with_flags(temp_, final_, RENAME_EXCHANGE) == 0 ? 0 : errno;
      if (err == 0) {
        old_copy = temp_;  // the exchange left the old directory under the temporary name
      } else if (err == EINVAL || err == ENOSYS) {
        // No atomic exchange here: move the old one aside first. A crash between the two renames
        // leaves no final directory, but both copies survive under hidden names.
        const fs::path aside = parent / ("." + final_.filename().native() +
                                         std::string(kSetAsideMarker) + unique_suffix());
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

namespace detail {
void simulate_missing_renameat2_flags(bool on) {
  g_no_renameat2_flags.store(on);
}
}  // namespace detail

}  // namespace zo::ckpt
