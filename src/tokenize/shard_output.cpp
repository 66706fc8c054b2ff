#include "tokenize/shard_output.h"

#include <unistd.h>

#include <cstdio>
#include <regex>

#include "checkpoint/atomic_io.h"
#include "core/error.h"
#include "data/shard.h"

namespace zo::tokenize {

namespace fs = std::filesystem;

std::vector<fs::path> ShardOutput::existing(const fs::path& dir, const std::string& name) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    if (f.rfind(name + "_", 0) != 0) continue;
    const std::string rest = f.substr(name.size() + 1);
    static const std::regex shard(R"((train|val)_[0-9]{6,}\.bin)");
    if (std::regex_match(rest, shard)) out.push_back(e.path());
  }
  return out;
}

ShardOutput::ShardOutput(const fs::path& dir, const std::string& name, bool force)
    : dir_(dir), name_(name) {
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.')
    throw DataError("--name '" + name + "' must be a plain file name prefix");
  // A file name holds 255 bytes: the staging directory's adds 31 (".tokenize-", ".tmp-", pid and
  // hex), a shard's 17 ("_train_000000.bin").
  if (name.size() > kMaxNameBytes) {
    throw DataError("the shard name (--name, or the first input's stem) is " +
                    std::to_string(name.size()) + " bytes long, over " +
                    std::to_string(kMaxNameBytes) +
                    " (the shards' and the staging directory's names must fit a file name's 255 "
                    "bytes); give a shorter --name");
  }
  if (const fs::path c = ckpt::enclosing_checkpoint(dir); !c.empty()) {
    throw DataError("--output-dir '" + dir.string() + "' is inside the checkpoint '" + c.string() +
                    "'; writing there would damage it. Choose a directory outside it");
  }
  const auto old = existing(dir, name);
  if (!old.empty() && !force) {
    throw DataError("'" + dir.string() + "' already holds shards named " + name + "_* (e.g. '" +
                    old.front().filename().string() +
                    "'); pass --force to replace them, or choose another --name or "
                    "--output-dir");
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw DataError("cannot create output directory '" + dir.string() + "': " + ec.message());
  // A killed run of the same NAME left its staging directory: removed once its process is gone
  // (the writer record tells, across pid reuse and reboots; another host's is kept).
  const std::string owner = "tokenize " + name;
  ckpt::remove_abandoned_saves(dir, owner);
  try {
    staging_.emplace(dir / ("tokenize-" + name), ckpt::IfExists::kReplace, owner);
  } catch (const CheckpointError& e) {
    throw DataError(std::string(e.what()) + " (is the output directory writable?)");
  }
}

int ShardOutput::shards(const std::string& split) const {
  return split == "val" ? val_ : train_;
}

void ShardOutput::write(const std::string& split, const std::vector<std::uint32_t>& tokens,
                        bool wide) {
  int& n = split == "val" ? val_ : train_;
  char number[16];
  std::snprintf(number, sizeof number, "%06d", n++);
  const fs::path path = staging_->temp_path() / (name_ + "_" + split + "_" + number + ".bin");
  if (wide) {
    data::write_token_shard(path.string(), std::span<const std::uint32_t>(tokens));
  } else {
    const std::vector<std::uint16_t> narrow(tokens.begin(), tokens.end());
    data::write_token_shard(path.string(), std::span<const std::uint16_t>(narrow));
  }
  written_.push_back(path);
}

void ShardOutput::commit() {
  std::vector<fs::path> keep;
  for (const auto& p : written_) {
    const fs::path to = dir_ / p.filename();
    std::error_code ec;
    fs::rename(p, to, ec);
    if (ec)
      throw DataError("cannot move '" + p.string() + "' to '" + to.string() + "': " + ec.message());
    keep.push_back(to);
  }
  for (const auto& old : existing(dir_, name_)) {  // --force: an older, longer run's extra shards
    if (std::find(keep.begin(), keep.end(), old) == keep.end()) fs::remove(old);
  }
  staging_.reset();  // removes the staging directory, now holding only the writer record
}

}  // namespace zo::tokenize
