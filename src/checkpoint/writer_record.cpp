// Who writes a temporary checkpoint directory (writer_record_text, written by AtomicDirectory),
// and remove_abandoned_saves, which removes a run's own temporaries whose writer is gone.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <system_error>

#include "checkpoint/atomic_io.h"
#include "checkpoint/atomic_io_internal.h"
#include "checkpoint/json_input.h"

namespace zo::ckpt {
namespace fs = std::filesystem;

namespace {

std::string first_line(const fs::path& p) {
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "";
  return name;
}

// A process's start, in clock ticks after boot (field 22 of /proc/<pid>/stat), or "" if there
// is no such process: with the pid it names one process of one boot, whatever reuses the pid.
std::string start_ticks(long pid) {
  const std::string stat = first_line("/proc/" + std::to_string(pid) + "/stat");
  const std::size_t close = stat.rfind(')');  // the command name may hold spaces and ')'
  if (close == std::string::npos) return "";
  std::istringstream fields(stat.substr(close + 1));
  std::string field;
  for (int k = 3; k <= 22 && fields >> field; ++k) {
    if (k == 22) return field;
  }
  return "";
}

// The PID namespace of this process ("pid:[4026531836]"), "" without /proc: pids name processes
// only inside one namespace (two containers may share a host name and a boot).
std::string pid_namespace() {
  std::error_code ec;
  const fs::path ns = fs::read_symlink("/proc/self/ns/pid", ec);
  return ec ? "" : ns.string();
}

struct Writer {
  std::string owner, host, boot, start;
  long pid = 0;
  std::string pid_ns;
};

nlohmann::json to_json(const Writer& w) {
  return {
      {"owner", w.owner}, {"host", w.host},   {"boot_id", w.boot},
      {"pid", w.pid},     {"start", w.start}, {"pid_ns", w.pid_ns},
  };
}

Writer this_process(std::string owner) {
  const long pid = ::getpid();
  Writer w;
  w.owner = std::move(owner);
  w.host = host_name();
  w.boot = first_line("/proc/sys/kernel/random/boot_id");
  w.start = start_ticks(pid);
  w.pid = pid;
  w.pid_ns = pid_namespace();
  return w;
}

// Whether the writer of `dir`, in another PID namespace, still holds the lock AtomicDirectory
// takes before writing its record: "" when the lock is free (its writer is gone, whichever
// namespace it ran in), else why it may still be writing. The lock taken here goes with `dir`.
std::string lock_held(const fs::path& dir, const Writer& w) {
  const std::string where = "written from PID namespace '" + w.pid_ns + "' (another container?)";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return where + ": its lock cannot be tested (" + std::strerror(errno) + ")";
  const int rc = ::flock(fd, LOCK_EX | LOCK_NB), err = errno;
  ::close(fd);
  if (rc == 0) return "";
  if (err == EWOULDBLOCK) return where + ": its writer still holds its lock";
  return where + ": its lock cannot be tested (" + std::strerror(err) + ")";
}

// Why the record's writer may still be writing, or "" when it is certainly gone.
std::string still_writing(const fs::path& dir, const Writer& w, const Writer& me) {
  if (w.host != me.host) {
    const std::string unseen = "': whether its writer still runs cannot be seen from here";
    return "written from host '" + w.host + unseen;
  }
  if (w.boot != me.boot) return "";                     // the machine restarted since
  if (w.pid_ns != me.pid_ns) return lock_held(dir, w);  // its pid means nothing here
  if (w.pid == me.pid) return "written by this process";
  const std::string start = start_ticks(w.pid);
  if (start.empty() || start != w.start) return "";
  return "its writer, process " + std::to_string(w.pid) + ", still runs";
}

}  // namespace

std::string writer_record_text(const std::string& owner) {
  return to_json(this_process(owner)).dump() + "\n";
}

AbandonedSaves remove_abandoned_saves(const fs::path& parent, const std::string& owner) {
  AbandonedSaves out;
  if (owner.empty()) return out;
  const Writer me = this_process(owner);
  for (const fs::path& dir : list_temporary_dirs(parent)) {
    const fs::path record = dir / kWriterRecordName;
    std::error_code ec;
    if (!fs::is_regular_file(fs::symlink_status(record, ec))) continue;  // not a record of ours
    Writer w;
    try {
      const nlohmann::json j = parse_json(read_file(record, 4096));
      w = {j.at("owner").get<std::string>(), j.at("host").get<std::string>(),
           j.at("boot_id").get<std::string>(), j.at("start").get<std::string>(),
           j.at("pid").get<long>(),
           // Records written before the namespace was recorded: taken as this one's, as then.
           j.contains("pid_ns") ? j.at("pid_ns").get<std::string>() : me.pid_ns};
    } catch (const std::exception&) {
      continue;  // unreadable: nobody's for certain
    }
    if (w.owner != owner) continue;
    const std::string why = still_writing(dir, w, me);
    if (!why.empty()) {
      out.kept.push_back(quoted(dir) + " (" + why + ")");
      continue;
    }
    fs::remove_all(dir, ec);
    if (ec) {
      out.kept.push_back(quoted(dir) + " (cannot be removed: " + ec.message() + ")");
    } else {
      out.removed.push_back(dir);
    }
  }
  return out;
}

}  // namespace zo::ckpt
