// The files a run writes besides checkpoints, checked before the first step rather than after
// hours of training.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace zo::train {

// Makes `dir` (and its parents) and proves it writable by creating and removing a file in it.
// Throws CheckpointError naming `flag`, the path, the OS error and the fix.
void ensure_writable_dir(const std::filesystem::path& dir, const char* flag);

// An output file the run will write: its folder is made and writable, and it is a regular file
// if it exists. With `keep_existing` (a fresh run's --metrics) an existing non-empty file is
// refused unless `overwrite`, since the run would replace it. Nothing is written or truncated.
void check_output_file(const std::filesystem::path& path, const char* flag, bool keep_existing,
                       bool overwrite);

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
