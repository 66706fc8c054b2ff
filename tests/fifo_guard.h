// Handing a reader a FIFO from a test without hanging the test: a reader that blocks in open()
// or read() is released after a timeout (the FIFO's other end is opened and closed, so it sees
// end of file) and the block is reported as a failure.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <filesystem>
#include <future>
#include <string>
#include <thread>

namespace zo::test {

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

}  // namespace zo::test
