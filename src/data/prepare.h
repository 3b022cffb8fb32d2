#pragma once
// `loco data prepare`: text or JSON Lines files (gzip-compressed or not) in, LOCOTOKS train/val files and a tokenizer out.
#include <cstdint>
#include <string>
#include <vector>

#include "data/text_input.h"

namespace loco {

struct PrepareOptions {
  std::vector<std::string> inputs;  // files or directories (searched recursively)
  // In directories, only files with these extensions (before an optional .gz) are read; files
  // named on the command line are always read. Hidden files and directories are skipped.
  std::vector<std::string> extensions = {"txt", "text", "md", "rst", "jsonl"};
  TextInputOptions input;           // text or JSON Lines, gzip-compressed or not
  std::string tokenizer = "sentencepiece";  // or "bytes"
  int vocab_size = 0;  // 0: 4096 for SentencePiece, 256 for bytes
  std::string model_type = "bpe";  // SentencePiece: bpe or unigram
  double val_fraction = 0.05;
  int block_lines = 64;  // the split assigns whole blocks of consecutive lines
  uint64_t seed = 0;
  std::string out_dir;
};

struct PrepareSummary {
  int64_t files = 0, bytes = 0, lines = 0;
  std::vector<std::string> skipped;  // files in the input directories that were not read
  bool val_tail = false;  // the hashed split held out nothing: validation is the input's tail
  int64_t train_tokens = 0, val_tokens = 0;
  int vocab_size = 0;
  double unigram_entropy = 0;  // nats per token, of the training tokens
};

PrepareSummary prepare_data(const PrepareOptions& options);

// Files named by `inputs`, directories expanded recursively, in sorted order: in directories only
// files with one of `extensions` (before an optional .gz), not hidden; `skipped` gets the others.
std::vector<std::string> list_input_files(const std::vector<std::string>& inputs,
                                          const std::vector<std::string>& extensions,
                                          std::vector<std::string>* skipped);

// ".txt, .md, ..." for messages.
std::string describe_extensions(const std::vector<std::string>& extensions);

// Entropy (nats) of the unigram distribution of the tokens (ids >= 0, as read_token_file gives).
double unigram_entropy(const std::vector<int32_t>& tokens);

}  // namespace loco
