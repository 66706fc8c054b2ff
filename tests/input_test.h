// Helpers of the hostile-input tests (test_*_input.cpp): a scratch directory, the message of the
// exception a call throws, and handing a reader a FIFO without hanging the test.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "run_binary.h"

namespace zo::test {

// A fresh directory per instance (TempDir's name, numbered), removed with everything in it.
struct Scratch : TempDir {
  Scratch() : TempDir("zo_input_" + std::to_string(next()) + "_") {}
  static int next() {
    static std::atomic<int> n{0};
    return n++;
  }
};

// The message of the exception fn throws, or "(no error)".
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_HAS(msg, sub)                               \
  EXPECT_NE(std::string(msg).find(sub), std::string::npos) \
      << "message: " << (msg) << "\nshould contain: " << (sub)

// A reader that blocks in open() or read() on `fifo` is released after a timeout (the other end is
// opened and closed, so it sees end of file) and the block is reported as a failure.
// Runs fn on a thread and returns its exception's message, or "(no error)".
template <class Fn>
std::string error_without_blocking(const std::filesystem::path& fifo, Fn fn) {
  std::promise<std::string> done;
  std::future<std::string> result = done.get_future();
  std::thread reader([&] {
    try {
      fn();
      done.set_value("(no error)");
    } catch (const std::exception& e) {
      done.set_value(e.what());
    }
  });
  if (result.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    ADD_FAILURE() << "the reader blocked on the FIFO " << fifo;
    while (result.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) {
      const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      if (fd >= 0) ::close(fd);
    }
  }
  reader.join();
  return result.get();
}

// The message of the exception fn throws (or "(no error)"), from a call that must end within
// `limit`: input whose work grows faster than its size stalls instead, and that is reported as a
// failure and ends the test process (the stalled call cannot be taken back).
template <class Fn>
std::string error_within(std::chrono::seconds limit, Fn fn) {
  auto done = std::make_shared<std::promise<std::string>>();
  std::future<std::string> result = done->get_future();
  std::thread([done, fn] {
    try {
      fn();
      done->set_value("(no error)");
    } catch (const std::exception& e) {
      done->set_value(e.what());
    }
  }).detach();
  if (result.wait_for(limit) != std::future_status::ready) {
    ADD_FAILURE() << "the call did not end within " << limit.count() << " s";
    std::_Exit(1);
  }
  return result.get();
}

}  // namespace zo::test
