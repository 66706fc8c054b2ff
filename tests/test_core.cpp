// core/: the Adam constants against the paper's formulas in double, byte formatting and parsing,
// and the serial queue's ordering and sticky-error rules (the dtype conversions: test_dtype.cpp).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/adam.h"
#include "core/bytes.h"
#include "core/error.h"
#include "core/serial_queue.h"

namespace {

// ---- Adam constants
// ------------------------------------------------------------------------------

// Each constant is the float nearest the double value of its formula (Kingma & Ba, Algorithm 1,
// with AdamW's decoupled decay, arXiv 1711.05101).
TEST(AdamScalars, AreTheFormulasRoundedOnce) {
  for (const bool decoupled : {true, false}) {
    for (const bool bias_correction : {true, false}) {
      zo::AdamConfig c;
      c.lr = 3e-4f;
      c.beta1 = 0.9f;
      c.beta2 = 0.95f;
      c.eps = 1e-8f;
      c.weight_decay = 0.1f;
      c.decoupled_weight_decay = decoupled;
      c.bias_correction = bias_correction;
      for (const std::int64_t t : {std::int64_t{1}, std::int64_t{7}, std::int64_t{100000}}) {
        const zo::AdamScalars s = zo::adam_scalars(c, t, 0.25f);
        const double b1 = c.beta1, b2 = c.beta2, lr = c.lr;
        const double bc1 = bias_correction ? 1.0 - std::pow(b1, double(t)) : 1.0;
        const double bc2 = bias_correction ? 1.0 - std::pow(b2, double(t)) : 1.0;
        EXPECT_EQ(s.beta1, c.beta1);
        EXPECT_EQ(s.beta2, c.beta2);
        EXPECT_EQ(s.one_minus_beta1, float(1.0 - b1));
        EXPECT_EQ(s.one_minus_beta2, float(1.0 - b2));
        EXPECT_EQ(s.neg_step_size, float(-lr / bc1)) << "t " << t;
        EXPECT_EQ(s.bc2_rsqrt, float(1.0 / std::sqrt(bc2))) << "t " << t;
        EXPECT_EQ(s.eps, c.eps);
        EXPECT_EQ(s.decay, decoupled ? float(1.0 - lr * double(c.weight_decay)) : 1.0f);
        EXPECT_EQ(s.l2, decoupled ? 0.0f : c.weight_decay);
        EXPECT_EQ(s.grad_mult, 0.25f);
      }
    }
  }
}

TEST(AdamConfig, ValidateNamesTheCallerAndTheField) {
  auto message = [](auto&& set) {
    zo::AdamConfig c;
    set(c);
    try {
      c.validate("who");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(message([](zo::AdamConfig&) {}), "(accepted)");
  EXPECT_EQ(message([](zo::AdamConfig& c) { c.lr = -1.0f; }).rfind("who: lr", 0), 0u);
  EXPECT_NE(message([](zo::AdamConfig& c) { c.beta1 = 1.0f; }).find("beta1"), std::string::npos);
  EXPECT_NE(message([](zo::AdamConfig& c) { c.beta2 = NAN; }).find("beta2"), std::string::npos);
  EXPECT_NE(message([](zo::AdamConfig& c) { c.eps = 0.0f; }).find("eps"), std::string::npos);
  EXPECT_NE(message([](zo::AdamConfig& c) { c.weight_decay = INFINITY; }).find("weight_decay"),
            std::string::npos);
  EXPECT_THROW(zo::check_adam_step("who", 0, 1.0f), std::invalid_argument);
  EXPECT_THROW(zo::check_adam_step("who", 1, -1.0f), std::invalid_argument);
  EXPECT_THROW(zo::check_adam_step("who", 1, NAN), std::invalid_argument);
  EXPECT_NO_THROW(zo::check_adam_step("who", 1, 0.0f));
}

// ---- bytes
// ----------------------------------------------------------------------------------------

TEST(Bytes, FormatPicksTheLargestUnitBelowTheValue) {
  EXPECT_EQ(zo::format_bytes(0), "0 B");
  EXPECT_EQ(zo::format_bytes(1023), "1023 B");
  EXPECT_EQ(zo::format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(zo::format_bytes(std::size_t{3} << 29), "1.50 GiB");
  EXPECT_EQ(zo::format_bytes(~std::size_t{0}), "16.00 EiB");
  EXPECT_EQ(zo::format_bytes_si(999), "999 B");
  EXPECT_EQ(zo::format_bytes_si(std::size_t{80} << 30), "85.90 GB");
  EXPECT_EQ(zo::format_bytes_si(80'000'000'000), "80.00 GB");
}

TEST(Bytes, ParseReadsBinaryAndDecimalUnitsAndRefusesTheRest) {
  EXPECT_EQ(zo::parse_bytes("4096"), 4096u);
  EXPECT_EQ(zo::parse_bytes("512MiB"), std::size_t{512} << 20);
  EXPECT_EQ(zo::parse_bytes("1.5GiB"), std::size_t{3} << 29);
  EXPECT_EQ(zo::parse_bytes("80GB"), std::size_t{80'000'000'000});
  for (const char* bad : {"", "MiB", "-1GiB", "0", "12 parsecs", "1e400", "nan"}) {
    try {
      zo::parse_bytes(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("512MiB"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(zo::parse_bytes(zo::format_bytes(std::size_t{7} << 30).erase(4, 1)),
            std::size_t{7} << 30);
}

// The count must fit 64 bits and be at least one whole byte: 0 means "not given" or "unlimited"
// to the callers, so nothing that rounds to it may slip through.
TEST(Bytes, ParseRefusesWhatDoesNotFitOrRoundsToNothingNamingTheFlag) {
  EXPECT_EQ(zo::parse_bytes("16777215TiB"), ((std::size_t{1} << 24) - 1) << 40);
  EXPECT_EQ(zo::parse_bytes("18446744073709549568"), ~std::size_t{0} - 2047);  // 2^64 - 2048
  EXPECT_EQ(zo::parse_bytes("1.3KiB"), 1331u);  // 1331.2 rounded to the nearest byte
  EXPECT_EQ(zo::parse_bytes("0.001KiB"), 1u);   // 1.024
  EXPECT_EQ(zo::parse_bytes("1e3"), 1000u);
  const std::pair<const char*, const char*> refused[] = {
      {"16777216TiB", "is too large"},           // 2^64
      {"99999999999TiB", "is too large"},        // used to wrap to 0 ("admits in 0 B")
      {"18446744073709551616", "is too large"},  // 2^64
      {"1e400", "is too large"},
      {"0.5B", "is not a whole number of bytes"},  // used to become 0: unlimited
      {"1.5", "is not a whole number of bytes"},
      {"0.0001KiB", "is less than one byte"},
      {"1e-400KiB", "is less than one byte"},
      {"0", "is not positive"},
      {"-1GiB", "is not positive"},
      {"0x10", "is not a size"},
      {" 5", "is not a size"},
      {"inf", "is not a size"},
  };
  for (const auto& [text, want] : refused) {
    try {
      zo::parse_bytes(text, "--host-memory");
      ADD_FAILURE() << "accepted '" << text << "'";
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind("--host-memory '" + std::string(text) + "' " + want, 0), 0u) << m;
    }
  }
  try {
    zo::parse_bytes("0");
    ADD_FAILURE() << "accepted 0";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "size '0' is not positive: a size is 1 byte to below 16 EiB (2^64 bytes), e.g. "
              "512MiB");
  }
}

TEST(Errors, OutOfMemoryNamesTheRequestAndTheFix) {
  const zo::OutOfMemoryError e("activations", std::size_t{3} << 30, std::size_t{70} << 30,
                               std::size_t{72} << 30);
  const std::string m = e.what();
  EXPECT_NE(m.find("activations"), std::string::npos) << m;
  EXPECT_NE(m.find("3.00 GiB"), std::string::npos) << m;
  EXPECT_NE(m.find("2.00 GiB free"), std::string::npos) << m;
  EXPECT_NE(m.find("--micro-batch"), std::string::npos) << m;
  EXPECT_EQ(e.requested(), std::size_t{3} << 30);
  EXPECT_EQ(e.capacity(), std::size_t{72} << 30);
}

// ---- serial queue ------------------------------------------------------------------------------

TEST(SerialQueue, RunsTasksInOrderOnOneOtherThread) {
  zo::SerialQueue q("test queue");
  std::vector<int> order;
  std::thread::id worker;
  for (int i = 0; i < 100; ++i) {
    q.post([&, i] {
      if (i == 0) worker = std::this_thread::get_id();
      EXPECT_EQ(std::this_thread::get_id(), worker);
      order.push_back(i);
    });
  }
  q.wait_idle();
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i)
    EXPECT_EQ(order[std::size_t(i)], i);
  EXPECT_NE(worker, std::this_thread::get_id());
}

TEST(SerialQueue, AnErrorSkipsLaterTasksUntilReportedOnce) {
  zo::SerialQueue q("test queue");
  std::atomic<bool> gate{false};
  q.post([&] {
    while (!gate)
      std::this_thread::yield();
  });
  q.post([] { throw std::runtime_error("first"); });
  q.post([] { throw std::logic_error("second, skipped"); });
  bool skipped_ran = false, marker_ran = false;
  q.post([&] { skipped_ran = true; });
  q.post([&] { marker_ran = true; }, /*always_run=*/true);
  // A task's captures are released when it is skipped (a ring slot, an event).
  auto held = std::make_shared<int>(1);
  q.post([held] {});
  const std::weak_ptr<int> watch = held;
  held.reset();
  gate = true;
  try {
    q.wait_idle();
    ADD_FAILURE() << "the error was not rethrown";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "first");
  }
  EXPECT_FALSE(skipped_ran);
  EXPECT_TRUE(marker_ran);
  EXPECT_TRUE(watch.expired());
  EXPECT_NO_THROW(q.wait_idle()) << "reported once";
  bool after = false;
  q.post([&] { after = true; });
  q.wait_idle();
  EXPECT_TRUE(after) << "the queue runs tasks again after the report";

  q.post([] { throw std::runtime_error("again"); });
  for (int spins = 0;; ++spins) {  // rethrow_if_failed does not wait: poll until it has run
    try {
      q.rethrow_if_failed();
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "again");
      break;
    }
    ASSERT_LT(spins, 100000) << "the failing task never ran";
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  EXPECT_NO_THROW(q.wait_idle());
}

TEST(SerialQueue, DestructorDrainsAndNeverThrows) {
  std::atomic<int> ran{0};
  {
    auto q = std::make_unique<zo::SerialQueue>("test queue");
    for (int i = 0; i < 10; ++i)
      q->post([&] { ++ran; });
    q->post([] { throw std::runtime_error("never reported"); });
    EXPECT_NO_THROW(q.reset());  // prints a warning naming the queue
  }
  EXPECT_EQ(ran.load(), 10);
}

}  // namespace
