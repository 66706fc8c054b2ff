// The files a run writes besides checkpoints, checked before the first step rather than after
// hours of training.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace zo::train {

// Makes `dir` (and its parents) and proves it writable by creating and removing a file in it.
// Throws CheckpointError naming `flag`, the path, the OS error and the fix.
void ensure_writable_dir(const std::filesystem::path& dir, const char* flag);

// An output file the run will write: its folder is made and writable, and it is a regular file
// if it exists. With `keep_existing` (a fresh run's --metrics, any run's --trace) an existing
// non-empty file is refused unless `overwrite`, since the run would replace it. Nothing is
// written or truncated.
void check_output_file(const std::filesystem::path& path, const char* flag, bool keep_existing,
                       bool overwrite);

// Refuses two outputs that are the same file or directory (--metrics and --trace, say): the
// second would replace the first. `outputs` pairs a flag with its path; empty paths are skipped.
void refuse_shared_outputs(
    const std::vector<std::pair<const char*, std::filesystem::path>>& outputs);

// The --checkpoint-dir of a run: made and writable, and neither a checkpoint nor inside one.
void check_checkpoint_dir_path(const std::filesystem::path& dir);

// Whether `available` bytes under --checkpoint-dir `dir` hold this run's checkpoints of `one`
// bytes: throws CheckpointError when not even one fits; returns a note when fewer than `kept` (the
// --keep saves and the one being written, or every save with --keep 0) fit at once, else "".
std::string check_checkpoint_room(const std::string& dir, std::uint64_t available,
                                  std::uint64_t one, std::uint64_t kept, int keep_last);

// An exclusive lock on a directory, held while the object lives: two runs in one --checkpoint-dir
// would replace each other's checkpoints. A POSIX record lock (fcntl) on the file kLockFileName in
// it, which network file systems (NFS) pass to the server, so runs on two hosts exclude each other
// too; the kernel drops it when the process ends, however it ends. The file stays (removing it
// would race with a run about to lock it). Throws CheckpointError when another process holds it;
// where the file system refuses locks, the lock is not taken and `note()` says so. (One per
// process: closing any other descriptor of the file would drop a POSIX lock.)
inline constexpr const char* kLockFileName = ".offload_train.lock";
class DirLock {
 public:
  DirLock() = default;
  DirLock(const std::filesystem::path& dir, const char* flag);
  ~DirLock();
  DirLock(DirLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)), note_(std::move(o.note_)) {}
  DirLock& operator=(DirLock&& o) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  const std::string& note() const { return note_; }

 private:
  int fd_ = -1;
  std::string note_;
};

// Whether a resumed run may continue the --metrics file: "" when it is missing or holds only
// metrics objects of run `run_id` (or of no run: files from before metrics named the run), else
// what it holds instead (another run's steps, lines that are not metrics objects). The last line
// may be cut short (kill -9: it begins with '{'; a power loss: zero bytes). Throws
// CheckpointError when it cannot be read.
std::string metrics_not_continuable(const std::filesystem::path& path, const std::string& run_id);

// A resumed run's --metrics file continues from the resumed step: the objects of later steps
// (written after that checkpoint by a run that then crashed, or by the steps a resume from an
// older checkpoint abandons) and lines that are not whole objects (a write cut short by kill -9)
// are dropped, the kept lines in their order, by an atomic rewrite. Returns what to tell the user
// ("" when the file is missing or already holds nothing after `step`). Throws CheckpointError
// naming the file when it cannot be read or rewritten; it is then unchanged.
std::string drop_metrics_after(const std::filesystem::path& path, std::int64_t step);

// Refuses an output path inside a checkpoint directory (one of its ancestors holds a
// MANIFEST.json): writing there would damage the checkpoint or be deleted with it by rotation.
void refuse_inside_checkpoint(const std::filesystem::path& path, const char* flag);

}  // namespace zo::train
