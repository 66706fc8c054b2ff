// Command-line mistakes as a user wants to see them: "offload_train: error: ..." naming the flag
// or subcommand, with the nearest valid one ("did you mean --lr?").
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace zo::cli {

// The candidate closest to `word` by edit distance, or "" when none is close enough to be a
// plausible typo (at most a third of the word's length, and at least 1, edits).
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);

// Reports a parse error of `app` on stderr; returns the exit status: 0 for --help and --version
// (printed as CLI11 does), 2 for every mistake.
int report_usage_error(const CLI::App& app, const CLI::ParseError& e);

// "" when `word` is a subcommand of app; otherwise what to print after "offload_train: error: ".
std::string unknown_subcommand(const CLI::App& app, const std::string& word);

}  // namespace zo::cli
