#include "train/run_outputs.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <stdexcept>
#include <system_error>

#include "checkpoint/atomic_io.h"
#include "core/bytes.h"
#include "core/error.h"

namespace zo::train {
namespace fs = std::filesystem;

namespace {

// Why `where` cannot be written, from the errno of a write probe, and the fix.
std::string unwritable(const std::string& where, int err) {
  const bool full = err == ENOSPC || err == EDQUOT;
  return where + (full ? " is on a full file system (" : " is not writable (") +
         std::strerror(err) + "); " + (full ? "free some space" : "fix its permissions") +
         " or choose another path";
}

}  // namespace

void ensure_writable_dir(const fs::path& dir, const char* flag) {
  const std::string where = std::string(flag) + " '" + dir.string() + "'";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    throw CheckpointError(where + " cannot be created as a directory (" +
                          (ec ? ec.message() : std::string("a file is in the way")) +
                          "); choose another path");
  }
  const fs::path probe = dir / (".offload_train-write-test-" + std::to_string(::getpid()));
  fs::remove(probe, ec);  // a leftover, or a planted symlink: never written through
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  int err = fd < 0 ? errno : 0;
  if (fd >= 0) {
    if (::write(fd, "x", 1) != 1) err = errno;
    if (::close(fd) != 0 && err == 0) err = errno;
    fs::remove(probe, ec);
  }
  if (err != 0) throw CheckpointError(unwritable(where, err));
}

void refuse_inside_checkpoint(const fs::path& path, const char* flag) {
  std::error_code ec;
  const fs::path dir =
      ckpt::enclosing_checkpoint(fs::weakly_canonical(fs::absolute(path, ec), ec).parent_path());
  if (!dir.empty()) {
    throw CheckpointError(std::string(flag) + " '" + path.string() +
                          "' is inside the checkpoint directory '" + dir.string() +
                          "'; writing there would damage the checkpoint. Choose a path "
                          "outside it");
  }
}

void check_checkpoint_dir_path(const fs::path& dir) {
  if (const fs::path c = ckpt::enclosing_checkpoint(dir); !c.empty()) {
    std::error_code ec;
    const bool itself = fs::equivalent(c, dir, ec);
    throw CheckpointError("--checkpoint-dir '" + dir.string() + "' " +
                          (itself ? std::string("is a checkpoint")
                                  : "is inside the checkpoint '" + c.string() + "'") +
                          ": saving there would damage it. Give the folder that holds the "
                          "checkpoints (to resume: --resume latest --checkpoint-dir " +
                          c.parent_path().string() + "), or another path");
  }
  ensure_writable_dir(dir, "--checkpoint-dir");
}

void refuse_shared_outputs(const std::vector<std::pair<const char*, fs::path>>& outputs) {
  std::vector<std::pair<const char*, fs::path>> seen;
  for (const auto& [flag, path] : outputs) {
    if (path.empty()) continue;
    std::error_code ec;
    const fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
    for (const auto& [other, q] : seen) {
      if (p == q || fs::equivalent(p, q, ec)) {
        throw std::invalid_argument(std::string(flag) + " and " + other + " name the same path '" +
                                    path.string() +
                                    "'; one would replace the other. Give each "
                                    "its own path");
      }
    }
    seen.emplace_back(flag, p);
  }
}

std::string check_checkpoint_room(const std::string& dir, std::uint64_t available,
                                  std::uint64_t one, std::uint64_t kept, int keep_last) {
  const std::string where = "--checkpoint-dir '" + dir + "'";
  if (available < one) {
    throw CheckpointError(where + " has " + format_bytes(available) +
                          " free, less than one checkpoint of this model (" + format_bytes(one) +
                          "); free space there, or choose another --checkpoint-dir");
  }
  if (available / one >= kept) return "";  // (kept * one could wrap)
  return where + " has " + format_bytes(available) + " free for " + std::to_string(kept) +
         " checkpoints of " + format_bytes(one) + " at once (" +
         (keep_last > 0 ? "--keep " + std::to_string(keep_last) + " and the save in progress"
                        : std::string("--keep 0 keeps every save")) +
         "): a later save may find the drive full";
}

DirLock::DirLock(const fs::path& dir, const char* flag) {
  const fs::path file = dir / kLockFileName;
  fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw CheckpointError(std::string(flag) + " '" + dir.string() +
                          "': cannot open its lock file '" + file.string() + "' (" +
                          std::strerror(errno) + "); fix its permissions or choose another path");
  }
  struct flock whole {};
  whole.l_type = F_WRLCK;
  whole.l_whence = SEEK_SET;
  if (::fcntl(fd_, F_SETLK, &whole) == 0) return;
  const int err = errno;
  ::close(fd_);
  fd_ = -1;
  if (err == EACCES || err == EAGAIN) {
    throw CheckpointError(std::string(flag) + " '" + dir.string() +
                          "' is in use by another offload_train run (it holds the lock on '" +
                          file.string() +
                          "'); wait for that run to finish, or choose another path");
  }
  note_ = std::string(flag) + " '" + dir.string() + "' could not be locked (" + std::strerror(err) +
          "): make sure no other run uses it at the same time";
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

DirLock& DirLock::operator=(DirLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    note_ = std::move(o.note_);
  }
  return *this;
}

void check_output_file(const fs::path& path, const char* flag, bool keep_existing, bool overwrite) {
  refuse_inside_checkpoint(path, flag);
  const fs::path folder = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  ensure_writable_dir(folder, flag);
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (st.type() == fs::file_type::not_found) return;
  const std::string where = std::string(flag) + " '" + path.string() + "'";
  if (!fs::is_regular_file(st)) {
    throw CheckpointError(where + " exists and is not a regular file; choose another path");
  }
  if (keep_existing && !overwrite && fs::file_size(path, ec) > 0) {
    throw CheckpointError(where + " already exists (another run's output?); choose another " +
                          "path, or pass --overwrite to replace it");
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);  // without truncating
  if (fd < 0) throw CheckpointError(unwritable(where, errno));
  ::close(fd);
}

std::string metrics_not_continuable(const fs::path& path, const std::string& run_id) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return "";
  std::ifstream in(path, std::ios::binary);
  std::string text;
  std::int64_t number = 0;
  while (std::getline(in, text)) {
    ++number;
    // The last line without its newline: a write cut short (kill -9: a prefix of an object; a
    // power loss: zero bytes), which the resume drops.
    if (in.eof() &&
        (text.empty() || text[0] == '{' || text.find_first_not_of('\0') == std::string::npos))
      break;
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer())
      return "line " + std::to_string(number) + " is not a metrics object";
    if (const auto it = j.find("run_id"); it != j.end() && *it != run_id)
      return "line " + std::to_string(number) + " is a step of another run";
  }
  if (in.bad() || !in.eof()) {
    throw CheckpointError("--metrics '" + path.string() +
                          "' cannot be read to continue it; fix its permissions or choose "
                          "another path");
  }
  return "";
}

std::string drop_metrics_after(const fs::path& path, std::int64_t step) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return "";
  // Calls line(text, keep) for every line; false when the file's last line lacks its newline.
  const auto read = [&](const std::function<void(const std::string&, bool)>& line) {
    std::ifstream in(path, std::ios::binary);
    std::string text;
    bool newline = true;
    while (std::getline(in, text)) {
      newline = !in.eof();
      const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
      line(text, j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
                     j["step"].get<std::int64_t>() <= step);
    }
    if (in.bad() || !in.eof()) {
      throw CheckpointError("--metrics '" + path.string() +
                            "' cannot be read to continue it; fix its permissions or choose "
                            "another path");
    }
    return newline;
  };
  std::int64_t kept = 0, dropped = 0;
  const bool ends_whole = read([&](const std::string&, bool keep) { ++(keep ? kept : dropped); });
  if (dropped == 0 && ends_whole) return "";
  ckpt::write_file_atomic(path, [&](const ckpt::ByteSink& sink) {
    read([&](const std::string& text, bool keep) {
      if (!keep) return;
      sink(std::as_bytes(std::span(text.data(), text.size())));
      sink(std::as_bytes(std::span("\n", 1)));
    });
  });
  if (dropped == 0) return "";  // only the last line's newline was missing
  return "--metrics '" + path.string() + "': dropped " + std::to_string(dropped) + " line" +
         (dropped == 1 ? "" : "s") + " after step " + std::to_string(step) +
         " (steps this run repeats from its checkpoint, or a line cut short); kept " +
         std::to_string(kept);
}

}  // namespace zo::train
