// Crash-safe files and checkpoint directories.
//
// A reader never sees a half-written file or directory under its final name: content is written
// under a temporary name in the same directory, fsynced, renamed into place (atomic on POSIX
// file systems), and the directory is fsynced so the rename itself survives a power loss. On any
// failure the temporary is removed and what was at the final name before is left untouched.
//
// Checkpoint directories carry a MANIFEST.json (size and CRC-32C of every file), written last,
// just before the directory is renamed into place: a directory without one is incomplete.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace zo::ckpt {

// Receives a file's bytes in order, in chunks of any size (the writer buffers small ones).
using ByteSink = std::function<void(std::span<const std::byte>)>;
// Produces a file's content by calling the sink; an exception it throws aborts the write and is
// rethrown unchanged (after the temporary file is removed).
using ByteProducer = std::function<void(const ByteSink&)>;

// ---- single files -------------------------------------------------------------------------------

// Writes `path` atomically: `<path>.tmp-<pid>-<random>` in the same directory, fsync, rename over
// `path`, fsync the directory. The directory must exist. Throws CheckpointError naming the path,
// the OS error and a fix (free disk space, choose a writable --checkpoint-dir, ...); the old
// content of `path`, if any, is then unchanged and no temporary file is left behind.
void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> bytes);
void write_file_atomic(const std::filesystem::path& path, std::string_view text);
void write_file_atomic(const std::filesystem::path& path, const ByteProducer& produce);

// Replaces files of directory `to` by the finished files `names` of directory `from` (the same
// file system), in order: first the files `retire` of `to` move into `from`, then each of
// `names` moves in, its previous version (if any) moving into `from` first. If a rename fails (a
// full disk can refuse a new name), every step is undone in reverse, so `to` is as it was, and
// CheckpointError names the file. The previous versions stay in `from` (under ".previous-" names)
// for the caller to delete with it. Then fsyncs `to`.
void replace_files(const std::filesystem::path& from, std::span<const std::string> names,
                   const std::filesystem::path& to, std::span<const std::string> retire);

// Reads a whole (small) file, e.g. a JSON state file; throws CheckpointError if it is missing,
// unreadable, larger than max_bytes or not a regular file (a FIFO, device or directory is refused
// without blocking).
std::string read_file(const std::filesystem::path& path, std::uint64_t max_bytes = 256u << 20);

// ---- checkpoint directories ---------------------------------------------------------------------

inline constexpr std::string_view kManifestName = "MANIFEST.json";

struct ManifestEntry {
  std::string path;  // relative to the checkpoint directory, '/'-separated
  std::uint64_t size = 0;
  std::uint32_t crc32c = 0;
};
struct Manifest {
  std::vector<ManifestEntry> files;  // sorted by path
};

enum class IfExists : std::uint8_t {
  kFail,     // commit() (and the constructor, early) refuse if the final directory exists
  kReplace,  // commit() swaps the new directory in atomically for an existing complete
             // checkpoint (one with a MANIFEST.json) and deletes that; anything else is refused
};

// The record in a temporary checkpoint directory of who writes it (an owner such as a run id,
// the host, boot, pid and start time of the process), removed by commit(). A process killed
// mid-save leaves it behind, so that a later run can tell its own abandoned saves from saves in
// progress (remove_abandoned_saves).
inline constexpr std::string_view kWriterRecordName = ".writer.json";

// Builds a directory under `<parent>/.<name>.tmp-<pid>-<random>` and publishes it as
// `final_path` on commit(). Without commit() (an exception, an early return) the destructor
// removes the temporary directory. Not thread-safe; one writer per directory.
class AtomicDirectory {
 public:
  // Creates the parent directories if needed. Throws CheckpointError if the parent cannot be
  // created or written, or (kFail) if final_path already exists. A non-empty `owner` is written
  // into the temporary directory's writer record.
  explicit AtomicDirectory(std::filesystem::path final_path, IfExists if_exists = IfExists::kFail,
                           const std::string& owner = {});
  ~AtomicDirectory();  // never throws
  AtomicDirectory(AtomicDirectory&& other) noexcept;
  AtomicDirectory& operator=(AtomicDirectory&&) = delete;
  AtomicDirectory(const AtomicDirectory&) = delete;
  AtomicDirectory& operator=(const AtomicDirectory&) = delete;

  // Where files go until commit(). Files may also be created here directly (any API); commit()
  // then reads them back for the manifest.
  const std::filesystem::path& temp_path() const { return temp_; }
  const std::filesystem::path& final_path() const { return final_; }

  // Writes `<temp>/<name>` (name relative, '/' allowed, no "..", not MANIFEST.json), fsyncs it and
  // records its size and CRC-32C on the fly, so commit() need not read it again. Don't modify a
  // file written this way afterwards.
  void write_file(std::string_view name, std::span<const std::byte> bytes);
  void write_file(std::string_view name, std::string_view text);
  void write_file(std::string_view name, const ByteProducer& produce);

  // fsyncs every file (checksumming those not written through write_file), writes MANIFEST.json,
  // fsyncs the directory, renames it to final_path and fsyncs the parent. Throws CheckpointError
  // on failure, leaving any existing final directory as it was.
  void commit();
  bool committed() const { return committed_; }

 private:
  struct Written {
    std::uint64_t size;
    std::uint32_t crc;
  };
  std::filesystem::path final_;
  std::filesystem::path temp_;
  IfExists if_exists_;
  bool has_record_ = false;  // a writer record is in temp_ until commit()
  int lock_fd_ = -1;         // with a record: temp_ opened and flock()ed (writer_record.cpp)
  bool active_ = false;      // owns temp_ (false once moved from or committed)
  bool committed_ = false;
  std::map<std::string, Written> written_;
};

// Checks `dir` against its MANIFEST.json: every listed file exists as a regular file with the
// listed size and CRC-32C, and the directory holds nothing else. Returns the manifest; throws
// CheckpointError listing every missing, truncated, corrupted, non-regular (FIFO, device: refused
// without blocking) or unlisted file and advising to use an older checkpoint. With `only`, the
// listed files outside it are neither required nor read (eval, sample and export read the weights
// alone: an optimizer file may be large, or deleted); every name in `only` must be listed.
Manifest verify_directory(const std::filesystem::path& dir, std::span<const std::string> only = {});

// ---- rotation -----------------------------------------------------------------------------------

// "<prefix><step zero-padded to 8 digits>", e.g. step_00001000 (longer when step >= 10^8).
std::string checkpoint_dir_name(std::string_view prefix, std::uint64_t step);

struct CheckpointDir {
  std::filesystem::path path;
  std::uint64_t step = 0;
};

// Complete checkpoints in `parent` (directories named checkpoint_dir_name(prefix, step) that hold
// a MANIFEST.json; other names are a user's), oldest first (by step number, not by name). Temporary
// directories (".name.tmp-") and incomplete ones are ignored. A missing parent gives an empty list.
std::vector<CheckpointDir> list_checkpoints(const std::filesystem::path& parent,
                                            std::string_view prefix);
// The entries of `parent` named like checkpoints (checkpoint_dir_name) that are not complete ones:
// files, or directories without a MANIFEST.json (a user's, or a copy cut short). A save at their
// step would have to replace them; nothing of this library does.
std::vector<CheckpointDir> list_incomplete(const std::filesystem::path& parent,
                                           std::string_view prefix);

// The checkpoint directory that is `dir` or holds it (the nearest one with a MANIFEST.json), or
// an empty path. Writing anything there would damage it or be deleted with it by rotation.
std::filesystem::path enclosing_checkpoint(const std::filesystem::path& dir);

// Deletes all but the newest keep_last_n complete checkpoints for which `belongs` is true (all of
// them without a predicate; keep_last_n == 0: keep all) and returns what it deleted. `protect`
// (the checkpoint just written) is never deleted and counts as kept. Never touches temporary or
// incomplete directories. Each deletion renames the checkpoint to a hidden ".<name>.del-" name
// first, so a crash mid-delete leaves a hidden leftover, never a half-deleted directory under
// the checkpoint's name.
std::vector<std::filesystem::path> rotate_checkpoints(
    const std::filesystem::path& parent, std::string_view prefix, std::size_t keep_last_n,
    const std::function<bool(const CheckpointDir&)>& belongs = {},
    const std::filesystem::path& protect = {});

// Moves the given checkpoints of `parent` into `parent`/<folder> (created), keeping their names,
// so that neither `latest` nor rotation sees them again; returns their new paths. Throws
// CheckpointError naming the directory that could not be moved (the others stay moved).
std::vector<std::filesystem::path> move_checkpoints_aside(const std::filesystem::path& parent,
                                                          const std::vector<CheckpointDir>& dirs,
                                                          const std::string& folder);

// Leftovers of interrupted writes in `parent` (".<name>.tmp-<pid>-<hex>", ".<name>.old-...",
// ".<name>.del-..."), and directories being written now.
std::vector<std::filesystem::path> list_temporary_dirs(const std::filesystem::path& parent);

// The hidden names a checkpoint goes by between two steps that a crash may separate:
// ".<name>.del-<pid>-<hex>" while rotation deletes it, ".<name>.old-<pid>-<hex>" while a
// replacement without an atomic exchange moves it aside (then it may be the only copy).
inline constexpr std::string_view kDeletingMarker = ".del-";
inline constexpr std::string_view kSetAsideMarker = ".old-";
// The checkpoints of `parent` under such a name (`marker`), with the step of <name>, oldest first.
std::vector<CheckpointDir> list_set_aside(const std::filesystem::path& parent,
                                          std::string_view prefix, std::string_view marker);

// Removes the temporary directories in `parent` whose writer record names `owner` and whose
// writer is gone: a process on this host and boot that no longer runs (its pid is free, or
// taken by a process started later), or a boot of this host before this one. Directories
// without a record (old writers, an exchanged-out checkpoint, another run's) are never touched;
// a record from another host is kept, since its writer cannot be seen from here.
struct AbandonedSaves {
  std::vector<std::filesystem::path> removed;
  std::vector<std::string> kept;  // "'<path>' (why)": the owner's, but maybe still written
};
AbandonedSaves remove_abandoned_saves(const std::filesystem::path& parent,
                                      const std::string& owner);

// The newest complete checkpoint, or nullopt if there is none. Does not verify checksums: call
// verify_directory() on the result before trusting it.
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& parent,
                                                       std::string_view prefix);

namespace detail {
// Tests only: make renameat2's NOREPLACE/EXCHANGE flags fail with EINVAL, as on file systems
// without them, to exercise the portable fallback of AtomicDirectory::commit().
void simulate_missing_renameat2_flags(bool on);
}  // namespace detail

}  // namespace zo::ckpt
