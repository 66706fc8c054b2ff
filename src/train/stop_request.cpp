#include "train/stop_request.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>

namespace zo::train {
namespace {

std::atomic<int> g_requested{0};  // lock-free, so the handler may touch it
static_assert(std::atomic<int>::is_always_lock_free);

void on_signal(int sig) {
  int none = 0;
  if (!g_requested.compare_exchange_strong(none, sig)) {
    // The second signal: the user insists. _exit is async-signal-safe; no destructor runs.
    const char msg[] = "offload_train: second signal, exiting now\n";
    (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
    ::_exit(128 + sig);
  }
  const char msg[] =
      "offload_train: stopping after this step (a checkpoint is written when --checkpoint-dir is "
      "set); signal again to exit at once\n";
  (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
}

}  // namespace

void install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a blocked read or wait resumes; the loop polls the flag
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

int stop_requested() noexcept {
  return g_requested.load();
}

void request_stop() noexcept {
  int none = 0;
  g_requested.compare_exchange_strong(none, -1);
}

void clear_stop() noexcept {
  g_requested.store(0);
}

}  // namespace zo::train
