// The two IoQueue implementations, made by make_io_queue (io_queue.cpp).
#pragma once

#include <memory>

#include "state_io/io_queue.h"

namespace zo::state_io::detail {

std::unique_ptr<IoQueue> make_thread_queue(unsigned threads, CompletionHook hook);
// Throws IoError when io_uring cannot be set up here (its text says why).
std::unique_ptr<IoQueue> make_uring_queue(unsigned depth, CompletionHook hook);

}  // namespace zo::state_io::detail
