// Training checkpoints: one directory per save, written atomically with a checksummed manifest.
//
//   step_00001000/
//     model.safetensors      master weights (F32, or BF16 with --master-weights bf16), Hugging
//                            Face names and shapes; the model spec in its metadata
//                            (kSpecMetadataKey), which must agree with trainer_state.json's
//     optimizer.safetensors  exp_avg.<name>, exp_avg_sq.<name> in the optimizer-state dtype (q8:
//                            U8 codes, and F32 exp_avg_absmax.<name>, exp_avg_sq_absmax.<name>)
//     trainer_state.json     step, Adam step, tokens seen, data cursor, resolved config, spec,
//                            the optimizer-state and master-weight dtypes
//     MANIFEST.json          size and CRC-32C of every file (written last)
//
// A data-parallel job of N ranks (docs/scale_out.md) writes, instead of optimizer.safetensors,
//     optimizer.rank<r>-of<N>.safetensors  rank r's exp_avg and exp_avg_sq, 1-D in its local order
// and trainer_state.json lists every shard file with the layout ranges it holds
// ("optimizer_shards"). model.safetensors is whole (rank 0 writes it from all ranks' masters).
// Loading takes each rank's owned ranges from whichever form the checkpoint has, so a run can
// resume with another number of ranks.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "comm/comm.h"
#include "model/layout.h"
#include "optim/host_optimizer.h"

namespace zo::train {

inline constexpr const char* kCheckpointPrefix = "step_";
// 2: model.safetensors always records the model spec (kSpecMetadataKey). 1 (still read): it may
// not.
inline constexpr int kCheckpointFormatVersion = 2;
inline constexpr int kOldestCheckpointFormatVersion = 1;
inline constexpr std::string_view kSpecMetadataKey = "offload_train_model_spec";

// Writes <parent>/step_<step>; trainer_state must hold "step". Replaces an existing directory of
// the same step. Then keeps the newest keep_last (0 = all).
std::filesystem::path save_checkpoint(const std::filesystem::path& parent,
                                      const model::ParameterLayout& layout,
                                      optim::HostOptimizer& opt,
                                      const nlohmann::json& trainer_state, int keep_last);

// The same, collectively over the ranks of `comm` (every rank calls it): partitions[r] is rank
// r's opt.owned(). Rank 0 builds the directory and publishes it only when every rank wrote its
// shard; otherwise every rank throws and the previous checkpoints stay as they were. Returns
// the directory on every rank.
std::filesystem::path save_checkpoint(
    const std::filesystem::path& parent, const model::ParameterLayout& layout,
    optim::HostOptimizer& opt, const nlohmann::json& trainer_state, int keep_last,
    comm::Communicator& comm, const std::vector<std::vector<optim::OwnedRange>>& partitions);

// Host memory the checkpoint, import and initialisation paths hold at once besides the
// optimizer's own arrays (the plan counts it): no whole-model copy anywhere, only pieces of
// tensors (a transposed GPT-2 Conv1D tensor whole, twice), a data-parallel gather of one piece
// per rank, and the file buffers.
std::size_t checkpoint_buffer_bytes(const model::ParameterLayout& layout, int ranks);

// The bytes of one checkpoint's files (weights in the master dtype, both moments in the state
// format with q8's block maxima, and an allowance for headers and trainer_state.json).
std::size_t checkpoint_file_bytes(const model::ParameterLayout& layout, DType master,
                                  StateFormat state);

// Resolves "latest" (the most recently saved complete checkpoint in parent; refused when a
// checkpoint at least as new cannot be read) or a directory path. `flag` names the value in
// messages.
std::filesystem::path resolve_checkpoint(const std::string& value,
                                         const std::filesystem::path& parent,
                                         std::string_view flag = "--resume");

// Which files of a checkpoint a reader verifies: every one (a resume), or the model alone (eval,
// sample, export: neither reads nor needs the optimizer state).
enum class CheckpointUse { kResume, kWeights };

// Verifies checksums and reads trainer_state.json (no weights); checks that its model spec is the
// one model.safetensors records, where it records one.
nlohmann::json read_trainer_state(const std::filesystem::path& dir,
                                  CheckpointUse use = CheckpointUse::kResume);
// Throws CheckpointError when the checkpoint's model is not the architecture `built`.
void check_checkpoint_model(const std::filesystem::path& dir, const nlohmann::json& trainer_state,
                            const model::ModelSpec& built);
// The model spec a checkpoint was trained with.
model::ModelSpec checkpoint_spec(const nlohmann::json& trainer_state);
// The config.json beside --init-from's weights (model::hf_config_beside), for a run or a sample
// without --model; std::invalid_argument naming the path and the fix when there is none.
std::string init_from_config(const std::string& init_from);

// Loads the owned part of the master weights, m, v and the Adam step into opt (from a whole or a
// sharded checkpoint); returns trainer_state. Throws
// CheckpointError when the checkpoint is corrupt or for a different model.
nlohmann::json load_checkpoint(const std::filesystem::path& dir,
                               const model::ParameterLayout& layout, optim::HostOptimizer& opt);

}  // namespace zo::train
