// For the emulator's own tests (test_simt): runs `f`, expecting a SimtError whose message
// contains `part`.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "simt.h"

namespace zo::simt {

template <typename F>
void expect_simt_error(F&& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no SimtError; expected one mentioning \"" << part << "\"";
  } catch (const SimtError& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

}  // namespace zo::simt
