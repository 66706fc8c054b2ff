// The exception types every layer may throw or catch. Each message says what is wrong, with the
// value or file involved, and what to do about it; the types let callers react (the planner
// to memory errors, the trainer to a broken data-parallel job) without parsing text.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

namespace zo {

// A data problem: missing or unreadable file, malformed shard, token out of range, too little
// data, a resume state from other data.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A checkpoint, safetensors file or weights file that cannot be read or written as asked.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A collective between ranks failed or did not complete in time (a rank died, hung or runs a
// different configuration).
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A device allocation would exceed the device's capacity: what was asked for, what is in use,
// the capacity (0: none set), so callers can suggest smaller settings.
class OutOfMemoryError : public std::runtime_error {
 public:
  OutOfMemoryError(const std::string& what, std::size_t requested, std::size_t in_use,
                   std::size_t capacity);
  std::size_t requested() const noexcept { return requested_; }
  std::size_t in_use() const noexcept { return in_use_; }
  std::size_t capacity() const noexcept { return capacity_; }

 private:
  std::size_t requested_, in_use_, capacity_;
};

// The host cannot provide memory; the message names the request and MemAvailable. `facts` is the
// message without its advice (what failed and why), for a caller that knows better advice; it
// defaults to the whole message.
class HostMemoryError : public std::runtime_error {
 public:
  HostMemoryError(const std::string& what, std::size_t requested_bytes, std::size_t available_bytes,
                  std::string facts = {})
      : std::runtime_error(what),
        requested_(requested_bytes),
        available_(available_bytes),
        facts_(facts.empty() ? what : std::move(facts)) {}
  std::size_t requested_bytes() const noexcept { return requested_; }
  std::size_t available_bytes() const noexcept { return available_; }
  const std::string& facts() const noexcept { return facts_; }

 private:
  std::size_t requested_;
  std::size_t available_;
  std::string facts_;
};

}  // namespace zo
