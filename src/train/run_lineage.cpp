#include "train/run_lineage.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <random>

#include "checkpoint/atomic_io.h"
#include "checkpoint/json_input.h"
#include "core/error.h"
#include "train/checkpoint_io.h"

namespace zo::train {
namespace fs = std::filesystem;
namespace {

// Lineage only: the file is not verified here (resume verifies it); a checkpoint that cannot be
// read belongs to no run and is never touched.
RunCheckpoint describe(const ckpt::CheckpointDir& d) {
  RunCheckpoint c{d.path, d.step, "?", 0, {}};
  try {
    // The reader's own bound: a sharded or many-file run's state passes 1 MiB.
    const nlohmann::json s = ckpt::parse_json(ckpt::read_file(d.path / "trainer_state.json"));
    c.run_id = s.value("run_id", std::string());
    c.saved_at_ns = s.value("saved_at_ns", std::int64_t{0});
  } catch (const std::exception& e) {
    c.run_id = "?";
    c.unreadable = e.what();
  }
  return c;
}

std::string list(const std::vector<RunCheckpoint>& cs) {
  std::string out;
  for (std::size_t i = 0; i < cs.size() && i < 4; ++i)
    out += (i ? ", " : "") + cs[i].path.filename().string();
  if (cs.size() > 4) out += " and " + std::to_string(cs.size() - 4) + " more";
  return out;
}

std::string utc_stamp() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

}  // namespace

std::string new_run_id() {
  std::random_device rd;
  const std::uint64_t x = (std::uint64_t(rd()) << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(x));
  return buf;
}

std::int64_t now_unix_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::vector<RunCheckpoint> run_checkpoints(const fs::path& parent) {
  std::vector<RunCheckpoint> out;
  for (const ckpt::CheckpointDir& d : ckpt::list_checkpoints(parent, kCheckpointPrefix))
    out.push_back(describe(d));
  return out;
}

const RunCheckpoint* latest_saved(const std::vector<RunCheckpoint>& checkpoints) {
  const auto it =
      std::max_element(checkpoints.begin(), checkpoints.end(), [](const auto& a, const auto& b) {
        return a.saved_at_ns != b.saved_at_ns ? a.saved_at_ns < b.saved_at_ns : a.step < b.step;
      });
  return it == checkpoints.end() ? nullptr : &*it;
}

DirClaim check_checkpoint_dir(const fs::path& parent, const std::string& run_id,
                              std::uint64_t start_step, bool overwrite) {
  DirClaim claim;
  std::vector<RunCheckpoint> others;
  for (RunCheckpoint& c : run_checkpoints(parent)) {
    if (c.run_id != run_id) {
      others.push_back(std::move(c));
    } else if (c.step > start_step) {
      claim.abandoned.push_back(std::move(c));
    }
  }
  // Entries named like checkpoints that are not complete ones: this run's own are what a deletion
  // by an earlier version cut short left (it removed MANIFEST.json first); anything else is
  // refused, even with --overwrite: it is not this run's to replace or delete.
  std::vector<ckpt::CheckpointDir> odd;
  for (ckpt::CheckpointDir& d : ckpt::list_incomplete(parent, kCheckpointPrefix)) {
    if (!run_id.empty() && describe(d).run_id == run_id) {
      claim.leftovers.push_back(std::move(d.path));
    } else {
      odd.push_back(std::move(d));
    }
  }
  for (ckpt::CheckpointDir& d :
       ckpt::list_set_aside(parent, kCheckpointPrefix, ckpt::kDeletingMarker)) {
    if (!run_id.empty() && d.step < start_step && describe(d).run_id == run_id) {
      claim.set_aside.push_back(std::move(d.path));
    } else {
      claim.notes.push_back("left " + d.path.string() + ": a copy of step " +
                            std::to_string(d.step) + " whose deletion was cut short (" +
                            (start_step == 0 ? std::string("not this run's")
                                             : "another run's, or not older than step " +
                                                   std::to_string(start_step)) +
                            "); remove it by hand once it is not needed");
    }
  }
  for (const ckpt::CheckpointDir& d :
       ckpt::list_set_aside(parent, kCheckpointPrefix, ckpt::kSetAsideMarker)) {
    claim.notes.push_back("left " + d.path.string() + ": a copy of step " + std::to_string(d.step) +
                          " moved aside by a replacement that was cut short, maybe its only "
                          "copy; remove it by hand once it is not needed");
  }
  if (!odd.empty()) {
    std::string names;
    for (std::size_t i = 0; i < odd.size() && i < 4; ++i)
      names += (i ? ", '" : "'") + odd[i].path.filename().string() + "'";
    if (odd.size() > 4) names += " and " + std::to_string(odd.size() - 4) + " more";
    throw CheckpointError("--checkpoint-dir '" + parent.string() + "' holds " + names +
                          ", named like a checkpoint but not a complete one (no MANIFEST.json: "
                          "not a checkpoint, or a copy cut short), which a run may neither "
                          "replace nor delete. Move it out of the way, or choose another "
                          "--checkpoint-dir");
  }
  if (!others.empty()) {
    if (!overwrite && start_step > 0) {  // resumed: 'latest' may well have been this run's
      throw CheckpointError(
          "--checkpoint-dir '" + parent.string() + "' also holds checkpoints of another run (" +
          list(others) + ") than the one resumed at step " + std::to_string(start_step) +
          ". Pass --overwrite to continue this run there anyway (same-numbered checkpoints of "
          "the other run are then replaced; its others are kept), give --resume the other "
          "run's checkpoint path to continue that one, or choose another --checkpoint-dir");
    }
    if (!overwrite) {
      throw CheckpointError(
          "--checkpoint-dir '" + parent.string() + "' holds checkpoints of another run (" +
          list(others) + "). Continue that run with --resume latest, choose another " +
          "--checkpoint-dir, or pass --overwrite to start this run there anyway (same-numbered " +
          "checkpoints are then replaced; the other run's others are kept)");
    }
    claim.notes.push_back("--overwrite: " + parent.string() +
                          " holds checkpoints of another run (" + list(others) +
                          "); same-numbered ones will be replaced, the rest kept");
  }
  return claim;
}

std::vector<std::string> remove_leftovers(const DirClaim& claim) {
  std::vector<std::string> notes;
  const auto remove = [&](const std::vector<fs::path>& dirs, const std::string& what,
                          const std::string& why) {
    for (const fs::path& p : dirs) {
      std::error_code ec;
      fs::remove_all(p, ec);
      notes.push_back(ec ? "could not remove " + p.string() + " (" + ec.message() + "), " + what +
                               "; remove it by hand"
                         : "removed " + p.string() + ", " + what + why);
    }
  };
  remove(claim.leftovers, "an incomplete checkpoint of this run", " (a deletion cut short)");
  remove(claim.set_aside, "an old checkpoint of this run", " whose deletion was cut short");
  return notes;
}

std::string move_abandoned(const fs::path& parent, const DirClaim& claim,
                           std::uint64_t start_step) {
  if (claim.abandoned.empty()) return {};
  std::vector<ckpt::CheckpointDir> dirs;
  for (const RunCheckpoint& c : claim.abandoned)
    dirs.push_back({c.path, c.step});
  // Unique: two resumes within a second would otherwise share (and collide in) one folder.
  const std::string stamp = "abandoned-" + utc_stamp();
  std::string folder = stamp;
  std::error_code ec;
  for (int n = 2; fs::exists(fs::symlink_status(parent / folder, ec)); ++n)
    folder = stamp + "-" + std::to_string(n);
  ckpt::move_checkpoints_aside(parent, dirs, folder);
  return "resuming at step " + std::to_string(start_step) + " abandons this run's " +
         list(claim.abandoned) + ": moved to " + (parent / folder).string() + " (not deleted)";
}

std::vector<fs::path> rotate_run_checkpoints(const fs::path& parent, const std::string& run_id,
                                             int keep_last, const fs::path& written) {
  return ckpt::rotate_checkpoints(
      parent, kCheckpointPrefix, static_cast<std::size_t>(keep_last),
      [&](const ckpt::CheckpointDir& d) { return describe(d).run_id == run_id; }, written);
}

}  // namespace zo::train
