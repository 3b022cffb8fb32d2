#include "data/prepare.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"
#include "data/text_input.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "io/fs.h"

namespace loco {

namespace fs = std::filesystem;

std::vector<std::string> list_input_files(const std::vector<std::string>& inputs) {
  check(!inputs.empty(), "--input: no input files given");
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> found;
      for (const auto& e : fs::recursive_directory_iterator(in, ec))
        if (e.is_regular_file()) found.push_back(e.path().string());
      if (ec) fail(in + ": cannot read directory: " + ec.message());
      std::sort(found.begin(), found.end());
      if (found.empty()) fail(in + ": directory has no files");
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(in, ec)) {
      files.push_back(in);
    } else {
      fail(in + ": no such file or directory");
    }
  }
  return files;
}

static double entropy_of_counts(const std::vector<int64_t>& counts) {
  double n = 0, h = 0;
  for (int64_t c : counts) n += double(c);
  for (int64_t c : counts)
    if (c > 0) h -= double(c) / n * std::log(double(c) / n);
  return h;
}

double unigram_entropy(const std::vector<int32_t>& tokens, int vocab_size) {
  std::vector<int64_t> counts(size_t(vocab_size), 0);
  for (int32_t t : tokens) ++counts[size_t(t)];
  return entropy_of_counts(counts);
}

namespace {

bool in_validation(const PrepareOptions& o, int64_t line_index) {
  // Whole blocks of consecutive lines go to one split, chosen by a seeded hash of the block.
  Rng r(mix_seed(o.seed, uint64_t(line_index / o.block_lines), 0x5a17));
  return r.uniform() < o.val_fraction;
}

}  // namespace

PrepareSummary prepare_data(const PrepareOptions& options) {
  PrepareOptions o = options;
  if (o.vocab_size == 0) o.vocab_size = o.tokenizer == "bytes" ? 256 : 4096;
  check(!o.out_dir.empty(), "--out is required");
  check(o.val_fraction >= 0 && o.val_fraction < 1, "--val-fraction must be in [0, 1)");
  check(o.block_lines >= 1, "block size must be >= 1 line");
  check(o.tokenizer == "bytes" || o.tokenizer == "sentencepiece",
        "--tokenizer must be bytes or sentencepiece, got " + o.tokenizer);
  check(o.model_type == "bpe" || o.model_type == "unigram", "--model-type must be bpe or unigram");
  const auto files = list_input_files(o.inputs);
  PrepareSummary sum;
  sum.files = int64_t(files.size());
  make_dirs(o.out_dir);

  // Pass 1: validate UTF-8; for SentencePiece, collect the training split's lines into one
  // temporary file (the trainer samples at most max_sentences of them, bounding memory).
  const std::string spm_input = o.out_dir + "/.tokenizer-train.txt";
  std::unique_ptr<std::ofstream> spm_out;
  if (o.tokenizer == "sentencepiece") spm_out = std::make_unique<std::ofstream>(spm_input, std::ios::binary);
  sum.bytes = for_each_input_line(files, o.input, true, [&](int64_t, std::string& line, int64_t index) {
    if (spm_out && !line.empty() && !in_validation(o, index)) *spm_out << line << '\n';
  });

  std::unique_ptr<Tokenizer> tok;
  nlohmann::json meta;
  if (o.tokenizer == "bytes") {
    if (o.vocab_size != 256)
      fail("--vocab-size must be 256 with the bytes tokenizer, got " + std::to_string(o.vocab_size));
    tok = make_byte_tokenizer();
    meta = {{"type", "bytes"}, {"vocab_size", 256}};
  } else {
    spm_out->close();
    check(o.vocab_size >= 300, "--vocab-size must be >= 300 for SentencePiece (256 byte pieces + specials)");
    try {
      train_sentencepiece({spm_input}, o.out_dir, {o.vocab_size, o.model_type, 2000000, o.seed});
    } catch (...) {
      std::filesystem::remove(spm_input);
      throw;
    }
    std::filesystem::remove(spm_input);
    tok = load_sentencepiece(o.out_dir + "/tokenizer.model");
    meta = {{"type", "sentencepiece"}, {"vocab_size", tok->vocab_size()}, {"model", "tokenizer.model"},
            {"model_type", o.model_type}};
  }
  sum.vocab_size = tok->vocab_size();

  // Pass 2: encode into the two token files; each document (a text file, a JSON Lines record)
  // ends with eos if the tokenizer has one, in the split its last line went to.
  TokenFileWriter train(o.out_dir + "/train.tok", uint64_t(sum.vocab_size));
  TokenFileWriter val(o.out_dir + "/val.tok", uint64_t(sum.vocab_size));
  std::vector<int64_t> counts(size_t(sum.vocab_size), 0);
  auto emit = [&](TokenFileWriter& dst, const std::vector<int32_t>& ids) {
    dst.append(ids.data(), ids.size());
    if (&dst == &train)
      for (int32_t id : ids) ++counts[size_t(id)];
  };
  TokenFileWriter* last = &train;
  int64_t current_doc = 0;
  int64_t line_index = 0;
  for_each_input_line(files, o.input, false, [&](int64_t doc, std::string& line, int64_t index) {
    if (doc != current_doc && tok->eos_id() >= 0) emit(*last, {tok->eos_id()});
    current_doc = doc;
    TokenFileWriter& dst = in_validation(o, index) ? val : train;
    if (o.tokenizer == "bytes") line.push_back('\n');
    emit(dst, tok->encode(line));
    last = &dst;
    line_index = index + 1;
  });
  if (tok->eos_id() >= 0) emit(*last, {tok->eos_id()});
  sum.lines = line_index;
  sum.train_tokens = int64_t(train.count());
  sum.val_tokens = int64_t(val.count());
  check(sum.train_tokens > 0, "the inputs produced no training tokens");
  train.finish();
  val.finish();
  sum.unigram_entropy = entropy_of_counts(counts);
  meta["train_tokens"] = sum.train_tokens;
  meta["val_tokens"] = sum.val_tokens;
  meta["unigram_entropy_nats"] = sum.unigram_entropy;
  meta["source_files"] = sum.files;
  meta["source_bytes"] = sum.bytes;
  write_file_atomic(o.out_dir + "/tokenizer.json", meta.dump(2) + "\n");
  return sum;
}

}  // namespace loco
