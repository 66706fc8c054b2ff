#include "usage_errors.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <sstream>

namespace zo::cli {
namespace {

// Edit distance with adjacent transpositions (optimal string alignment): inserting, deleting,
// replacing a character or swapping two neighbours each cost 1, as typos do.
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i)
    d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j)
    d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// The subcommand being parsed (the deepest one), or null.
const CLI::App* parsing(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App* s) { return s->parsed(); }))
    return sub;
  return nullptr;
}

std::vector<std::string> flags_of(const CLI::App& app) {
  std::vector<std::string> out;
  for (const CLI::Option* o : app.get_options()) {
    for (const std::string& l : o->get_lnames())
      out.push_back("--" + l);
    for (const std::string& s : o->get_snames())
      out.push_back("-" + s);
  }
  return out;
}

std::vector<std::string> subcommands_of(const CLI::App& app) {
  std::vector<std::string> out;
  for (const CLI::App* s : app.get_subcommands({}))
    out.push_back(s->get_name());
  return out;
}

}  // namespace

std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = std::max<std::size_t>(1, word.size() / 3) + 1;
  for (const std::string& c : candidates) {
    const std::size_t d = edit_distance(word, c);
    // Ties go to the candidate of the word's length (a swap or a slip, not a missing letter).
    if (d < best_d ||
        (d == best_d && !best.empty() && c.size() == word.size() && best.size() != word.size())) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

int report_usage_error(const CLI::App& app, const CLI::ParseError& e) {
  if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
  const CLI::App* sub = parsing(app);
  const std::string where = sub ? "offload_train " + sub->get_name() : "offload_train";
  std::string message = e.what();
  if (const auto* extras = dynamic_cast<const CLI::ExtrasError*>(&e)) {
    (void)extras;
    // "The following argument(s) were not expected: a b": name the unknown flags (the values
    // that followed them are not the mistake) and each one's nearest neighbour.
    const auto colon = message.find(": ");
    std::istringstream words(colon == std::string::npos ? message : message.substr(colon + 2));
    std::vector<std::string> flags, others;
    for (std::string w; words >> w;)
      (w[0] == '-' ? flags : others).push_back(w.substr(0, w.find('=')));
    message.clear();
    for (const std::string& f : flags) {
      message += (message.empty() ? "" : "; ") + std::string("unknown flag '") + f + "'";
      const std::string guess = nearest(f, flags_of(sub ? *sub : app));
      if (!guess.empty()) message += ", did you mean " + guess + "?";
    }
    if (flags.empty()) {
      for (const std::string& o : others)
        message += (message.empty() ? "" : "; ") + std::string("unexpected argument '") + o + "'";
    }
  }
  std::fprintf(stderr, "offload_train: error: %s (see %s --help)\n", message.c_str(),
               where.c_str());
  return 2;
}

std::string unknown_subcommand(const CLI::App& app, const std::string& word) {
  for (const std::string& s : subcommands_of(app))
    if (s == word) return {};
  std::string m = "unknown subcommand '" + word + "'";
  const std::string guess = nearest(word, subcommands_of(app));
  if (!guess.empty()) m += ", did you mean " + guess + "?";
  return m + " (see offload_train --help)";
}

}  // namespace zo::cli
