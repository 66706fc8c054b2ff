// A full disk that works as root: with RLIMIT_FSIZE lowered and SIGXFSZ ignored, write() fails
// with EFBIG past the limit, down the same code path as ENOSPC.
#pragma once

#include <signal.h>
#include <sys/resource.h>

#include <cstddef>

namespace zo::test {

// Lowers the soft file-size limit to `bytes` until destroyed. active() is false (nothing
// changed) where the hard limit is too low to restore a useful one afterwards: skip the test.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(std::size_t bytes) {
    if (::getrlimit(RLIMIT_FSIZE, &old_) != 0) return;
    if (old_.rlim_max != RLIM_INFINITY && old_.rlim_max < (1u << 20)) return;
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    rlimit lim = old_;
    lim.rlim_cur = bytes;
    active_ = ::setrlimit(RLIMIT_FSIZE, &lim) == 0;
    if (!active_) ::signal(SIGXFSZ, old_handler_);
  }
  ~FileSizeLimit() {
    if (!active_) return;
    ::setrlimit(RLIMIT_FSIZE, &old_);
    ::signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;
  bool active() const { return active_; }

 private:
  rlimit old_{};
  sighandler_t old_handler_ = SIG_DFL;
  bool active_ = false;
};

}  // namespace zo::test
