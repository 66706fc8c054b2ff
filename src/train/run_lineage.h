// Which checkpoints belong to which run, so that a run never deletes or replaces another's.
//
// Every run has a run id (random at a fresh start, inherited on resume) recorded in each of its
// checkpoints' trainer_state.json with the time it was saved. In a --checkpoint-dir:
// - a run refuses to start when the directory holds checkpoints of another run, unless
//   --overwrite (then same-numbered ones may be replaced, and the others are still kept);
// - resuming from an older step moves this run's newer checkpoints, abandoned by the resume,
//   into abandoned-<time>/ (never deleted) and says so;
// - rotation (--keep) deletes only this run's checkpoints, never the one just written;
// - `--resume latest` is the most recently saved checkpoint, not merely the highest step.
// Checkpoints written before run ids existed share the empty id.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace zo::train {

struct RunCheckpoint {
  std::filesystem::path path;
  std::uint64_t step = 0;
  std::string run_id;            // "" for checkpoints written before run ids existed
  std::int64_t saved_at_ns = 0;  // wall clock (Unix epoch) at the save; 0 when unknown
  std::string unreadable;        // why trainer_state.json could not be read ("" if it could)
};

std::string new_run_id();    // 16 random hex digits
std::int64_t now_unix_ns();  // the wall clock, for saved_at

// The complete checkpoints in `parent` with their run ids, oldest step first. A checkpoint whose
// trainer_state.json cannot be read gets the run id "?" (it belongs to no run: never deleted).
std::vector<RunCheckpoint> run_checkpoints(const std::filesystem::path& parent);

// The most recently saved of `checkpoints` (by saved_at, then step), or nullptr for none.
const RunCheckpoint* latest_saved(const std::vector<RunCheckpoint>& checkpoints);

// What run `run_id`, starting at `start_step` (0: fresh), finds in its --checkpoint-dir `parent`.
struct DirClaim {
  std::vector<std::string> notes;                // what to tell the user
  std::vector<RunCheckpoint> abandoned;          // this run's checkpoints newer than start_step
  std::vector<std::filesystem::path> leftovers;  // this run's incomplete checkpoint directories
  // This run's checkpoints older than start_step that its rotation was deleting when it was cut
  // short (hidden ".<name>.del-" names); any other such copy, and every one a replacement set
  // aside (".<name>.old-": maybe the only copy), is only named in `notes`.
  std::vector<std::filesystem::path> set_aside;
};
// Throws CheckpointError listing the checkpoints of other runs unless `overwrite`, and entries
// named like checkpoints that are not complete ones (unless this run's) always. Changes nothing.
DirClaim check_checkpoint_dir(const std::filesystem::path& parent, const std::string& run_id,
                              std::uint64_t start_step, bool overwrite);
// Removes this run's incomplete and set-aside checkpoint directories once the run is sure to
// start; returns what to tell the user.
std::vector<std::string> remove_leftovers(const DirClaim& claim);
// Moves the abandoned checkpoints into parent/abandoned-<UTC time>/ (-2, -3, ... appended when
// that exists) once the run is sure to start;
// returns what to tell the user ("" when there were none).
std::string move_abandoned(const std::filesystem::path& parent, const DirClaim& claim,
                           std::uint64_t start_step);

// Rotation after a save: keeps the newest keep_last checkpoints of run `run_id` (0: all) and
// the one just written; returns what it deleted.
std::vector<std::filesystem::path> rotate_run_checkpoints(const std::filesystem::path& parent,
                                                          const std::string& run_id, int keep_last,
                                                          const std::filesystem::path& written);

}  // namespace zo::train
