#include "tokenize_command.h"

#include <unistd.h>

#include <cstdio>

#include "tokenize/tokenizer.h"

namespace zo::cli {

void add_tokenize_command(CLI::App& app, TokenizeCommand& cmd) {
  auto* t = app.add_subcommand("tokenize",
                               "Turn text (.txt, .jsonl, directories) into llm.c token shards "
                               "with a Hugging Face byte-level BPE tokenizer");
  auto& o = cmd.options;
  t->add_option("--tokenizer", cmd.tokenizer,
                "tokenizer.json, or a directory holding it or GPT-2's encoder.json + vocab.bpe")
      ->required();
  t->add_option("--output-dir", o.output_dir, "where the shards go (created if missing)")
      ->required();
  t->add_option("--name", o.name, "shard name prefix (default: the first input's stem)");
  t->add_option("--val-docs", o.val_docs, "the first K documents form the val split")
      ->capture_default_str();
  t->add_option("--shard-tokens", o.shard_tokens, "tokens per shard at most")
      ->capture_default_str();
  t->add_option("--text-field", o.text_field, "the document's field in .jsonl objects")
      ->capture_default_str();
  t->add_option("--doc-token", o.doc_token,
                "token before each document (default <|begin_of_text|>, else <|endoftext|>)");
  // Beyond any machine (train's bound too): oneTBB crashed on an arena of 2^31 - 1 threads.
  t->add_option("--threads", o.threads, "encoding threads; 0 = all cores")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  t->add_flag("--force", o.force, "replace shards of the same name in the output directory");
  t->add_option("inputs", o.inputs, ".txt files, .jsonl files or directories")->required();
  cmd.app = t;
}

int run_tokenize(const TokenizeCommand& cmd) {
  const auto tokenizer = tokenize::Tokenizer::load(cmd.tokenizer);
  std::FILE* progress = ::isatty(::fileno(stderr)) ? stderr : nullptr;
  const auto sum = tokenize::tokenize_files(cmd.options, *tokenizer, progress);
  std::printf("%s\n", sum.summary_line().c_str());
  return 0;
}

}  // namespace zo::cli
