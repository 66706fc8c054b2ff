// What a resumed run takes from its checkpoint. A run is defined by its model, data and
// optimization settings; the checkpoint's trainer_state.json records them (TrainConfig::to_json),
// and resuming restores every one the command line does not give again, so `--resume latest
// --steps N` continues the same run. Settings of this invocation only (steps, device, mode,
// precision, threads, memory, output paths, checkpoint cadence, logging) are not restored.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/config.h"

namespace zo::train {

// The to_json() keys a resume restores unless given explicitly (TrainConfig::explicit_keys), and
// the command-line flag that gives each ("micro_batch" -> "--micro-batch").
const std::vector<std::string>& restored_keys();
std::string flag_of(const std::string& key);

// Restores cfg's settings from a checkpoint's recorded config (trainer_state.json "config").
// Returns one line per explicitly given value that differs from the checkpoint's, e.g.
// "--lr 0.001 (the checkpointed run used 0.003)". Throws CheckpointError naming the key for a
// value of the wrong type; a key missing from an older checkpoint keeps cfg's value.
std::vector<std::string> restore_run_settings(TrainConfig& cfg, const nlohmann::json& saved);

}  // namespace zo::train
