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

// An exclusive advisory lock (flock) on a directory, held while the object lives: two runs in
// one --checkpoint-dir would replace each other's checkpoints. Throws CheckpointError when
// another process holds it. Where the file system has no flock (some network file systems), the
// lock is not taken and `note()` says so.
class DirLock {
 public:
  DirLock() = default;
  explicit DirLock(const std::filesystem::path& dir, const char* flag);
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
// may be cut short (kill -9) if it begins as a metrics object. Throws CheckpointError when it
// cannot be read.
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
