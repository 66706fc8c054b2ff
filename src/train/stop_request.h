// Stopping a run cleanly from outside: SIGINT (Ctrl-C) or SIGTERM (a scheduler's preemption)
// asks the training loop to stop after the current step, write a checkpoint and exit non-zero; a
// second signal exits at once (checkpoints are written atomically, so the previous ones stay
// intact). docs/reliability.md.
#pragma once

namespace zo::train {

// Installs the SIGINT and SIGTERM handlers (the CLI calls it once; a library user may not).
void install_stop_signals();
// The signal that asked for a stop (SIGINT, SIGTERM), -1 for request_stop(), 0 for none.
int stop_requested() noexcept;
void request_stop() noexcept;  // as a first signal would (tests, embedding programs)
void clear_stop() noexcept;    // forget a request (tests)

}  // namespace zo::train
